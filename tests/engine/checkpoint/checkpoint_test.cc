// Checkpoints of the engine: a run resumed from one continues bit for bit (every stage, precision
// and offload placement); one saved at one world size and stage loads at another with the same
// weights and optimizer state and trains on as the unchanged run would (to reduction order);
// damaged files and edited manifests are refused with the file named and the engine untouched;
// `latest` and retention behave across saves.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/checkpoint/checkpoint.h"
#include "tests/engine/mlp_harness.h"

namespace zeroth {
namespace {

using testing::MlpRun;
using testing::run_ranks;
namespace fs = std::filesystem;

// A fresh folder per test, removed at the end.
class Scratch {
 public:
  explicit Scratch(const std::string& name) : path_(fmt::format("{}/zeroth-ckpt-{}-{}", ::testing::TempDir(), name, ::getpid())) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Scratch() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string operator/(const std::string& sub) const { return path_ + "/" + sub; }

 private:
  std::string path_;
};

// Runs `body` on every rank of a local group of `dp` with a finalized engine (the harness's
// config at `stage`) holding an MLP of `widths`.
void on_ranks(int dp, int stage, const std::vector<int>& widths, const std::function<void(Communicator&, Engine&, Mlp&)>& body,
              const std::function<void(EngineConfig&)>& tweak = {}) {
  run_local_ranks(dp, [&](Communicator& comm) {
    auto device = make_device("cpu", {});
    MlpRun run;
    run.stage = stage;
    EngineConfig config = testing::mlp_config(run);
    if (tweak) tweak(config);
    Engine engine(*device, comm, config);
    Mlp mlp(engine, {widths});
    engine.finalize();
    body(comm, engine, mlp);
  });
}

void on_ranks(int dp, int stage, const std::function<void(Communicator&, Engine&, Mlp&)>& body) {
  on_ranks(dp, stage, MlpRun{}.widths, body);
}

struct Placement {
  int stage;
  DType dtype;
  OffloadDevice optimizer = OffloadDevice::none;
  OffloadDevice params = OffloadDevice::none;
};
void PrintTo(const Placement& p, std::ostream* os) {
  *os << "stage " << p.stage << ", " << dtype_name(p.dtype) << ", optimizer on " << offload_device_name(p.optimizer)
      << ", parameters on " << offload_device_name(p.params);
}

MlpRun placed_run(const Placement& p, const std::string& swap) {
  MlpRun run;
  run.stage = p.stage;
  run.dtype = p.dtype;
  run.gas = 2;
  run.steps = 6;
  run.tweak = [p, swap](EngineConfig& e) {
    e.zero.sub_group_size = 1000;
    e.zero.offload_optimizer.device = p.optimizer;
    e.zero.offload_optimizer.nvme_path = swap;
    e.zero.offload_param.device = p.params;
    e.zero.offload_param.nvme_path = swap;
    // f16: a scale that overflows at first and grows again after 2 clean steps, so the resumed run
    // must carry the scaler's scale and its count of clean steps.
    e.loss_scaler.initial_scale_power = 18;
    e.loss_scaler.loss_scale_window = 2;
  };
  return run;
}

class Resume : public ::testing::TestWithParam<Placement> {};

// The uninterrupted run saves after 3 of its 6 steps; a second run loads that and runs steps
// 4-6: the same losses, gradient norms, loss scales and final weights, bit for bit.
TEST_P(Resume, ContinuesBitForBit) {
  const Placement& p = GetParam();
  Scratch dir("resume");
  MlpRun whole = placed_run(p, dir / "swap");
  whole.checkpoint_dir = dir / "ckpt";
  whole.save_after = 3;
  const auto ref = run_ranks(2, whole);
  MlpRun resumed = placed_run(p, dir / "swap");
  resumed.resume = dir / "ckpt";
  const auto got = run_ranks(2, resumed);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(got[r].losses.size(), 3u);
    ASSERT_EQ(got[r].steps.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(got[r].losses[k], ref[r].losses[k + 3]) << "rank " << r << " step " << k + 4;
      EXPECT_EQ(got[r].steps[k].grad_norm, ref[r].steps[k + 3].grad_norm) << "step " << k + 4;
      EXPECT_EQ(got[r].steps[k].loss_scale, ref[r].steps[k + 3].loss_scale) << "step " << k + 4;
      EXPECT_EQ(got[r].steps[k].step, ref[r].steps[k + 3].step) << "optimizer steps applied, step " << k + 4;
      EXPECT_EQ(got[r].steps[k].lr, ref[r].steps[k + 3].lr) << "step " << k + 4;
    }
    for (size_t b = 0; b < ref[r].weights.size(); ++b)
      EXPECT_EQ(got[r].weights[b], ref[r].weights[b]) << "rank " << r << " block " << b;
  }
  if (p.dtype == DType::f16) {
    // The scale had dropped before the save (an overflow at step 1) and moves again after it
    // (doubled at step 4, an overflow at step 5): the resumed run followed it only because the
    // scale and its count of clean steps were restored.
    EXPECT_TRUE(ref[0].steps[0].skipped);
    EXPECT_EQ(ref[0].steps[2].loss_scale, 0x1.0p17);
    EXPECT_EQ(ref[0].steps[3].loss_scale, 0x1.0p18);
    EXPECT_TRUE(ref[0].steps[4].skipped);
  }
}

std::vector<Placement> placements() {
  std::vector<Placement> out;
  for (int stage = 0; stage <= 3; ++stage) out.push_back({stage, DType::f32});
  out.push_back({1, DType::bf16});
  out.push_back({2, DType::f16});
  out.push_back({3, DType::bf16});
  out.push_back({3, DType::f16});
  for (OffloadDevice d : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    out.push_back({1, DType::f32, d});
    out.push_back({2, DType::bf16, d});
    out.push_back({3, DType::bf16, d});
    out.push_back({3, DType::bf16, d, d});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryStage, Resume, ::testing::ValuesIn(placements()), [](const auto& info) {
  const Placement& p = info.param;
  return fmt::format("stage{}_{}_optimizer_{}_params_{}", p.stage, dtype_name(p.dtype), offload_device_name(p.optimizer),
                     offload_device_name(p.params));
});

// Every tensor's master weights and moments, whole, put together from every rank's owned range.
struct FullState {
  std::mutex mutex;
  std::map<std::string, std::vector<float>> tensors;  // "<block>.<param>/<kind>"
};

std::function<void(Engine&, int)> capture_at(int step, FullState& out) {
  return [step, &out](Engine& engine, int done) {
    if (done != step) return;
    const Plan& plan = engine.plan();
    for (size_t b = 0; b < plan.blocks.size(); ++b) {
      const auto& spec = engine.block_spec(static_cast<int>(b));
      for (StateKind kind : {StateKind::master, StateKind::moment0, StateKind::moment1}) {
        const OwnedRange& r = plan.range(kind, static_cast<int>(b));
        std::vector<float> values(r.numel());
        engine.read_owned(kind, static_cast<int>(b), values);
        std::lock_guard lock(out.mutex);
        for (size_t i = 0; i < spec.params.size(); ++i) {
          const size_t p0 = plan.blocks[b].param_offsets[i], n = spec.params[i].numel();
          auto& full = out.tensors[fmt::format("{}.{}/{}", spec.name, spec.params[i].name, state_kind_name(kind))];
          full.resize(n, std::nanf(""));
          for (size_t e = std::max(p0, r.lo); e < std::min(p0 + n, r.hi); ++e) full[e - p0] = values[e - r.lo];
        }
      }
    }
  };
}

// Saved at dp 4, stage 3; loaded at dp 2 stage 1, dp 1 stage 0, dp 8 stage 3 and dp 3 stage 2 with
// the optimizer state in host memory: every element of the master weights and both moments equal; training on gives the losses of the
// run that stayed at dp 4 (within reduction order: 1e-6 relative, as the stage-equivalence tests).
TEST(Checkpoint, LoadsAtAnotherWorldSizeAndStage) {
  Scratch dir("elastic");
  FullState saved;
  MlpRun whole;
  whole.stage = 3;
  whole.steps = 6;
  whole.checkpoint_dir = dir / "ckpt";
  whole.save_after = 3;
  whole.inspect = capture_at(3, saved);
  const auto ref = run_ranks(4, whole);
  ASSERT_EQ(saved.tensors.size(), 3u * 6u);  // 3 layers x (weight, bias) x 3 kinds
  struct Target {
    int dp, stage;
    OffloadDevice optimizer;
  };
  // Fewer ranks and lower stages; more ranks; another offload placement.
  for (auto [dp, stage, optimizer] : {Target{2, 1, OffloadDevice::none}, Target{1, 0, OffloadDevice::none},
                                      Target{8, 3, OffloadDevice::none}, Target{3, 2, OffloadDevice::cpu}}) {
    FullState loaded;
    MlpRun run;
    run.stage = stage;
    run.tweak = [optimizer](EngineConfig& e) { e.zero.offload_optimizer.device = optimizer; };
    run.steps = 6;
    run.resume = dir / "ckpt";
    run.inspect = capture_at(3, loaded);
    const auto got = run_ranks(dp, run);
    for (const auto& [name, values] : saved.tensors) {
      ASSERT_TRUE(loaded.tensors.count(name)) << name;
      EXPECT_EQ(loaded.tensors[name], values) << name << " at dp " << dp << " stage " << stage;
    }
    ASSERT_EQ(got[0].losses.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      // The mean loss of the global batch: the harness's losses are per rank, so average them.
      double mine = 0, theirs = 0;
      for (const auto& r : got) mine += r.losses[k] / dp;
      for (const auto& r : ref) theirs += r.losses[k + 3] / 4;
      EXPECT_NEAR(mine, theirs, 1e-6 * theirs) << "step " << k + 4 << " at dp " << dp;
    }
  }
}

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

// One step of the MLP on a rank of 2 (or 1), batch k.
void mlp_step(Engine& engine, Mlp& mlp, const Communicator& comm, int k) {
  const MlpRun run;
  std::vector<float> x, t, loss(1);
  const int mb = run.global_batch / comm.size();
  testing::mlp_batch(k, run.global_batch, 16, 8, x, t);
  mlp.forward_backward(x.data() + comm.rank() * mb * 16, t.data() + comm.rank() * mb * 8, mb, loss.data(), 0);
  engine.step();
  engine.compute_stream().synchronize();
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

// Saves after steps 1-4 with keep_last 2: step-3 and step-4 stay, `latest` names step-4, and the
// leftover of an interrupted save is cleared. When `latest` names a folder that is gone, the newest
// complete one loads. A run resumed from step-3 saves step-4 again: the new folder takes the old
// one's place (swapped in one rename) and holds the new run's weights.
TEST(Checkpoint, LatestAndRetention) {
  Scratch dir("latest");
  const std::string ckpt = dir / "ckpt";
  std::vector<float> at_step3, again_step4;
  on_ranks(2, 1, [&](Communicator& comm, Engine& engine, Mlp& mlp) {
    for (int k = 0; k < 4; ++k) {
      mlp_step(engine, mlp, comm, k);
      if (k == 2 && comm.rank() == 0) fs::create_directories(ckpt + "/.tmp-step-9");  // a save a crash cut short
      ckpt::save(engine, {.dir = ckpt, .keep_last = 2});
      if (k == 2) {
        const auto w = engine.master_values(0);
        if (comm.rank() == 0) at_step3 = w;
      }
    }
  });
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(ckpt)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-3", "step-4"}));
  EXPECT_EQ(ckpt::resolve(ckpt), ckpt + "/step-4");
  std::ofstream(ckpt + "/latest") << "step-7\n";
  EXPECT_EQ(ckpt::resolve(ckpt), ckpt + "/step-4");
  const std::string old_manifest = ckpt + "/step-4/manifest.json";
  const auto old_time = fs::last_write_time(old_manifest);
  on_ranks(1, 0, [&](Communicator& comm, Engine& engine, Mlp& mlp) {
    ckpt::load(engine, ckpt + "/step-3");
    EXPECT_EQ(engine.steps_run(), 3);
    auto w = engine.master_values(0);
    w.resize(at_step3.size());
    EXPECT_EQ(w, at_step3);
    // Another batch than the first run's step 4: other weights at step 4.
    mlp_step(engine, mlp, comm, 40);
    ckpt::save(engine, {.dir = ckpt, .keep_last = 2});
    again_step4 = engine.master_values(0);
  });
  names.clear();
  for (const auto& e : fs::directory_iterator(ckpt)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-3", "step-4"}));
  EXPECT_EQ(ckpt::resolve(ckpt), ckpt + "/step-4");
  EXPECT_NE(fs::last_write_time(old_manifest), old_time);
  on_ranks(2, 0, [&](Communicator&, Engine& engine, Mlp&) {
    ckpt::load(engine, ckpt);
    auto w = engine.master_values(0);
    w.resize(at_step3.size());
    auto want = again_step4;
    want.resize(at_step3.size());
    EXPECT_EQ(w, want);
    EXPECT_NE(w, at_step3);
  });
}

// An asynchronous save copies the state at save() and publishes at complete(): until then the
// step folder does not exist; after a further step changed the weights, the checkpoint still
// holds those of the save's step, bit for bit.
TEST(Checkpoint, AsyncSaveHoldsTheStateOfItsStep) {
  Scratch dir("async");
  const std::string ckpt = dir / "ckpt";
  std::vector<float> at_save;
  on_ranks(2, 3, [&](Communicator& comm, Engine& engine, Mlp& mlp) {
    ckpt::Saver saver(true);
    mlp_step(engine, mlp, comm, 0);
    const auto w = engine.master_values(0);
    const ckpt::IoStats started = saver.save(engine, {.dir = ckpt});
    EXPECT_TRUE(saver.pending());
    EXPECT_EQ(started.path, ckpt + "/step-1");
    EXPECT_FALSE(fs::exists(ckpt + "/step-1"));
    mlp_step(engine, mlp, comm, 1);
    const ckpt::IoStats done = saver.complete(engine);
    EXPECT_FALSE(saver.pending());
    EXPECT_GT(done.all_bytes, 0u);
    EXPECT_LE(done.blocked_seconds, done.seconds);
    if (comm.rank() == 0) at_save = w;
  });
  EXPECT_EQ(ckpt::resolve(ckpt), ckpt + "/step-1");
  on_ranks(1, 0, [&](Communicator&, Engine& engine, Mlp&) {
    ckpt::load(engine, ckpt);
    EXPECT_EQ(engine.steps_run(), 1);
    auto w = engine.master_values(0);
    w.resize(engine.plan().blocks[0].numel);
    at_save.resize(w.size());
    EXPECT_EQ(w, at_save);
  });
}

// A checkpoint folder that cannot be made fails the save on every rank (no rank waits for the
// others), with the folder named.
TEST(Checkpoint, UnwritableFolderFailsEveryRank) {
  Scratch dir("unwritable");
  std::ofstream(dir / "file") << "x";
  std::mutex mutex;
  std::vector<std::string> errors;
  on_ranks(2, 0, [&](Communicator&, Engine& engine, Mlp&) {
    try {
      ckpt::save(engine, {.dir = dir / "file/ckpt"});
    } catch (const IoError& e) {
      std::lock_guard lock(mutex);
      errors.push_back(e.what());
    }
  });
  ASSERT_EQ(errors.size(), 2u);
  std::sort(errors.begin(), errors.end());
  // Rank 0's own error names the folder; the other rank's names rank 0.
  EXPECT_NE(errors[0].find("cannot create the checkpoint folder " + (dir / "file/ckpt")), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 0 failed"), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace zeroth
