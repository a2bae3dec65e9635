// Checkpoints of the engine: a run resumed from one continues bit for bit (every stage, precision
// and offload placement); one saved at one world size and stage loads at another with the same
// weights and optimizer state and trains on as the unchanged run would (to reduction order);
// `latest` and retention behave across saves. Loading's ways and damaged files are in
// checkpoint_load_test.cc.
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
#include "tests/engine/checkpoint/checkpoint_fixture.h"
#include "tests/engine/mlp_harness.h"

namespace zeroth {
namespace {

using testing::MlpRun;
using testing::run_ranks;
namespace fs = std::filesystem;

using namespace checkpoint_fixture;

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
