// Loading a checkpoint against the state it was saved from: its three ways (into the engine, through
// a host buffer, verified then read again) give the same engine bit for bit at the world that wrote
// it and at another; damaged files and edited manifests are refused with the file named and the
// engine untouched.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/checkpoint/checkpoint.h"
#include "tests/engine/checkpoint/checkpoint_fixture.h"
#include "tests/engine/mlp_harness.h"

namespace zeroth {
namespace {

using namespace checkpoint_fixture;
using testing::MlpRun;
using testing::run_ranks;
namespace fs = std::filesystem;

// Everything of the rank's a load writes: every block's master values and its owned moments.
std::vector<std::vector<float>> rank_state(Engine& engine) {
  std::vector<std::vector<float>> state;
  for (size_t b = 0; b < engine.plan().blocks.size(); ++b) {
    state.push_back(engine.master_values(static_cast<int>(b)));
    for (StateKind kind : {StateKind::moment0, StateKind::moment1}) {
      state.emplace_back(engine.plan().range(kind, static_cast<int>(b)).numel());
      engine.read_owned(kind, static_cast<int>(b), state.back());
    }
  }
  return state;
}

// The load's three ways (ckpt::LoadOptions): into the pristine engine as the files stream in,
// through one host buffer, and verified first then read again.
struct LoadWay {
  const char* name;
  ckpt::LoadOptions options;
};
const std::vector<LoadWay>& load_ways() {
  static const std::vector<LoadWay> ways = [] {
    ckpt::LoadOptions buffered, twice;
    buffered.stream_into_engine = twice.stream_into_engine = false;
    twice.landing_bytes_limit = 0;
    return std::vector<LoadWay>{{"into the engine", {}}, {"through a host buffer", buffered}, {"verified, then read again", twice}};
  }();
  return ways;
}

// What a load reports for a damaged checkpoint, and that the engine it was loading into is as it
// was (its fresh weights, zero moments).
std::string load_error(const std::string& path, std::vector<int> widths = MlpRun{}.widths, const ckpt::LoadOptions& options = {},
                       const std::function<void(EngineConfig&)>& tweak = {}) {
  std::string error;
  std::mutex mutex;
  int loaded = 0;  // ranks whose load succeeded: none or all
  on_ranks(
      2, 0, widths,
      [&](Communicator& comm, Engine& engine, Mlp&) {
    const auto before = rank_state(engine);
    try {
      ckpt::load(engine, path, nullptr, false, options);
      std::lock_guard lock(mutex);
      ++loaded;
      return;
    } catch (const Error& e) {
      std::lock_guard lock(mutex);
      if (comm.rank() == 0) error = e.what();
    }
    EXPECT_TRUE(rank_state(engine) == before) << "the failed load changed the engine";
    EXPECT_EQ(engine.steps_run(), 0);
      },
      tweak);
  EXPECT_TRUE(loaded == 0 || loaded == 2) << "one rank loaded what the other refused";
  return error;
}

// A saved checkpoint (2 ranks, stage 2, 2 steps) to damage.
std::string saved_checkpoint(const Scratch& dir, const std::vector<int>& widths = MlpRun{}.widths) {
  MlpRun run;
  run.widths = widths;
  run.stage = 2;
  run.steps = 2;
  run.checkpoint_dir = dir / "ckpt";
  run.save_after = 2;
  run_ranks(2, run);
  return dir / "ckpt/step-2";
}

void flip_byte(const std::string& path, long at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x20);
  f.seekp(at);
  f.write(&c, 1);
}

TEST(Checkpoint, DamageIsRefusedNamingTheFile) {
  Scratch dir("damage");
  const std::string step = saved_checkpoint(dir);
  ASSERT_EQ(load_error(dir / "ckpt"), "");  // whole, it loads
  const std::string data = step + "/rank-00001.bin", manifest = step + "/manifest.json";
  fs::copy(step, dir / "pristine", fs::copy_options::recursive);
  auto restore = [&] {
    fs::remove_all(step);
    fs::copy(dir / "pristine", step, fs::copy_options::recursive);
  };
  auto expect = [&](const std::string& what, const std::vector<std::string>& parts) {
    const std::string e = load_error(step);
    for (const auto& p : parts) EXPECT_NE(e.find(p), std::string::npos) << what << ": \"" << p << "\" missing in: " << e;
    std::printf("%s: %s\n", what.c_str(), e.c_str());
    restore();
  };
  // Damage in a data file, each way: the bytes before it have streamed in (into the engine, in the
  // first way), and the engine is as it was all the same.
  for (const auto& way : load_ways()) {
    ASSERT_EQ(load_error(step, MlpRun{}.widths, way.options), "") << way.name;
    auto expect_way = [&](const std::string& what, const std::vector<std::string>& parts) {
      const std::string e = load_error(step, MlpRun{}.widths, way.options);
      for (const auto& p : parts)
        EXPECT_NE(e.find(p), std::string::npos) << what << ", " << way.name << ": \"" << p << "\" missing in: " << e;
      restore();
    };
    flip_byte(data, static_cast<long>(fs::file_size(data) / 2));
    expect_way("a flipped byte", {data, "is corrupted", "checksum"});
    flip_byte(data, static_cast<long>(fs::file_size(data) - 1));
    expect_way("a flipped last byte", {data, "is corrupted", "checksum"});
    fs::resize_file(data, fs::file_size(data) - 4);
    expect_way("a truncated file", {data, "is truncated"});
    fs::remove(data);
    expect_way("a deleted file", {data, "is missing"});
  }
  // Into an engine whose state is in swap files (which it streams into): the moments written there
  // are zeros again.
  const std::string swap = dir / "swap";
  fs::create_directories(swap);
  const auto in_swap_files = [&](EngineConfig& c) {
    c.zero.stage = 3;
    c.zero.offload_optimizer.device = c.zero.offload_param.device = OffloadDevice::nvme;
    c.zero.offload_optimizer.nvme_path = c.zero.offload_param.nvme_path = swap;
  };
  on_ranks(
      2, 3, MlpRun{}.widths,
      [&](Communicator&, Engine& engine, Mlp&) { EXPECT_EQ(ckpt::load(engine, step).way, "each file read once, into the engine"); },
      in_swap_files);
  flip_byte(data, static_cast<long>(fs::file_size(data) / 2));
  const std::string e = load_error(step, MlpRun{}.widths, {}, in_swap_files);
  EXPECT_NE(e.find("is corrupted"), std::string::npos) << e;
  restore();
  {
    std::ifstream in(manifest);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    in.close();
    std::ofstream(manifest) << text.substr(0, text.size() / 2);
  }
  expect("a cut manifest", {manifest, "not valid JSON"});
  auto edit = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(manifest));
    change(j);
    std::ofstream(manifest) << j.dump();
  };
  edit([](auto& j) { j["tensors"][0]["shape"][0] = 17; });
  expect("an edited shape", {manifest, "layer0.weight"});
  edit([](auto& j) { j["tensors"][1]["fp32"][0][3] = 3; });
  expect("an edited piece", {manifest, "layer0.bias", "hold 3 of its 32 elements"});
  edit([](auto& j) { j["files"][0]["xxh3_64"] = "0123456789abcdef"; });
  expect("an edited checksum", {step + "/rank-00000.bin", "is corrupted"});
  edit([](auto& j) { j["tensors"][0]["name"] = "layer9.weight"; });
  expect("another model", {manifest, "has no tensor"});
  edit([](auto& j) {
    j["states"][1] = "momentum_buffer";
    for (auto& t : j["tensors"]) {
      t["momentum_buffer"] = t["exp_avg"];
      t.erase("exp_avg");
    }
  });
  expect("another optimizer", {manifest, "exp_avg", "optimizer"});
  // A split that the world does not have, or that does not fit the shape: refused, never read
  // through (it would put elements in the wrong places).
  edit([](auto& j) { j["tensors"][0]["split"] = {{"axis", 0}, {"groups", 1}, {"parts", 2}}; });
  expect("a split of another world", {manifest, "layer0.weight", "2 tensor-parallel parts", "tp = 1"});
  edit([](auto& j) { j["tensors"][0]["split"] = {{"axis", 2}, {"groups", 1}, {"parts", 1}}; });
  expect("a split along no axis", {manifest, "layer0.weight", "split"});
  edit([](auto& j) { j["version"] = 99; });
  expect("a newer format", {manifest, "version 99"});
  // The same names, other shapes: a model of other widths.
  const std::string other = load_error(step, {16, 40, 32, 8});
  EXPECT_NE(other.find("tensor layer0.weight has the shape [32, 16] in the checkpoint but [40, 16] in this model"), std::string::npos)
      << other;
  // One layer fewer: every tensor of the model is there, the checkpoint has more.
  const std::string fewer = load_error(step, {16, 32, 32});
  EXPECT_NE(fewer.find("the checkpoint holds 6 tensors, this model 4"), std::string::npos) << fewer;
  fs::remove(manifest);
  EXPECT_NE(load_error(step).find("no checkpoint there"), std::string::npos);
}

// A checkpoint loaded each way gives the same engine, bit for bit: at the world that wrote it (the
// first way streams into the engine) and at another (a reshard, which takes a host buffer); into an
// engine that has stepped, the first way is not taken. Each way says which it was.
TEST(Checkpoint, LoadWaysAgree) {
  Scratch dir("ways");
  // Files of 9 KiB, and of 13.5 MB, which stream in pieces of 8 MiB, tensors straddling them.
  for (const auto& widths : {MlpRun{}.widths, std::vector<int>{16, 1500, 1500, 8}}) {
    const std::string step = saved_checkpoint(dir, widths);
    for (const auto& [dp, stage] : {std::pair{2, 2}, std::pair{1, 0}}) {
      std::vector<std::vector<std::vector<float>>> got;  // per load and rank, the rank's state
      for (const auto& way : load_ways()) {
        for (const bool stepped : {false, true}) {
          std::mutex mutex;
          std::vector<std::vector<std::vector<float>>> mine(dp);
          on_ranks(dp, stage, widths, [&](Communicator& comm, Engine& engine, Mlp& mlp) {
            if (stepped) mlp_step(engine, mlp, comm, 0);
            const ckpt::IoStats io = ckpt::load(engine, step, nullptr, false, way.options);
            std::string expected = way.name;
            if (expected == "into the engine" && (stepped || dp != 2)) expected = "through a host buffer";
            const std::map<std::string, std::string> says = {{"into the engine", "each file read once, into the engine"},
                                                             {"through a host buffer", "each file read once, through a host buffer"},
                                                             {"verified, then read again", "the files verified, then read again"}};
            EXPECT_EQ(io.way, says.at(expected)) << way.name << " at dp " << dp << (stepped ? ", stepped" : "");
            EXPECT_EQ(engine.steps_run(), 2);
            const auto state = rank_state(engine);  // collective
            std::lock_guard lock(mutex);
            mine[comm.rank()] = state;
          });
          got.insert(got.end(), mine.begin(), mine.end());
        }
      }
      ASSERT_EQ(got.size(), 6u * dp);
      for (size_t i = static_cast<size_t>(dp); i < got.size(); ++i) {
        EXPECT_TRUE(got[i] == got[i % dp]) << "load " << i / dp << ", rank " << i % dp << " at dp " << dp << " of widths " << widths[1]
                                           << " differs";
      }
    }
  }
}

}  // namespace
}  // namespace zeroth
