// The delayed update (offload_optimizer.delayed_update) against the serial step fed the gradients
// of the parameters one update behind: the same engine with the update run at once, and a host
// (StaleParams) that hands the model, on every step whose predecessor's update was delayed, the
// parameters that step computed with. After a warm-up of serial steps each update runs under the
// next step's forward and backward; the losses, gradient norms, master weights and both moments
// must equal the reference bit for bit, at stages 1-3, one and two ranks, f32, bf16 and f16, cpu
// and nvme, with clipped steps and one that overflows (skipped: the update before it is published
// and nothing is left running, so the step after it sees every update).
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tests/engine/executor/same_training.h"
#include "tests/engine/executor/swap_folder.h"
#include "tests/engine/mlp_harness.h"

namespace zeroth {
namespace {

using testing::expect_same_training;
using testing::FinalState;
using testing::MlpRun;
using testing::run_ranks;

struct Case {
  int stage, dp, gas;
  DType dtype;
  OffloadDevice optimizer = OffloadDevice::nvme;
  OffloadDevice params = OffloadDevice::none;  // stage 3: offload_param too
  DType reduction = DType::f32;                // communication_data_type
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << "stage " << c.stage << ", dp " << c.dp << ", gas " << c.gas << ", " << dtype_name(c.dtype) << ", optimizer on "
      << offload_device_name(c.optimizer) << ", parameters on " << offload_device_name(c.params) << ", reduced in "
      << dtype_name(c.reduction);
}

constexpr int kSteps = 8, kWarmup = 2, kPoisoned = 5;

// Whether step j's update was delayed: the warm-up's updates were applied before it, and it was
// not skipped (a skipped step launches nothing).
bool delayed(int j, const std::vector<StepResult>& steps) {
  int applied = 0;
  for (int i = 0; i < j; ++i) applied += steps.at(i).skipped ? 0 : 1;
  return applied >= kWarmup && !steps.at(j).skipped;
}

MlpRun delayed_run(const Case& c, bool delay, bool stale_reference, FinalState& state) {
  MlpRun run;
  run.stage = c.stage;
  run.gas = c.gas;
  run.dtype = c.dtype;
  run.steps = kSteps;
  run.poison_rank = c.dp - 1, run.poison_step = kPoisoned;
  run.tweak = [c, delay](EngineConfig& e) {
    e.zero.sub_group_size = 1000;  // several sub-groups per bucket and per rank, slots reused
    e.gradient_clipping = 2.3;     // bites on some steps (the MLP's norms start near 2.5)
    e.zero.offload_optimizer.device = c.optimizer;
    if (c.optimizer == OffloadDevice::nvme) e.zero.offload_optimizer.nvme_path = testing::swap_dir();
    e.zero.offload_optimizer.delayed_update = delay;
    e.zero.offload_optimizer.delayed_update_warmup = kWarmup;
    e.communication_dtype = c.reduction;
    e.zero.offload_param.device = c.params;
    if (c.params == OffloadDevice::nvme) e.zero.offload_param.nvme_path = testing::swap_dir();
  };
  if (stale_reference) {
    run.stale_params = [](int k, const std::vector<StepResult>& steps) { return k >= 1 && delayed(k - 1, steps); };
  }
  run.inspect = state.keep_after(kSteps);
  return run;
}

class DelayedUpdate : public ::testing::TestWithParam<Case> {};

TEST_P(DelayedUpdate, EqualsTheSerialStepFedStaleParameters) {
  const Case& c = GetParam();
  FinalState reference_state, delayed_state, serial_state;
  const auto reference = run_ranks(c.dp, delayed_run(c, false, true, reference_state));
  const auto run = run_ranks(c.dp, delayed_run(c, true, false, delayed_state));
  const auto serial = run_ranks(c.dp, delayed_run(c, false, false, serial_state));
  expect_same_training(run, delayed_state, reference, reference_state);
  if (HasFatalFailure()) return;  // the runs' shapes differ: nothing below can be indexed
  for (int r = 0; r < c.dp; ++r) {
    for (size_t k = 0; k < reference[r].steps.size(); ++k) {
      EXPECT_EQ(run[r].steps[k].update_delayed, delayed(static_cast<int>(k), reference[r].steps)) << "rank " << r << " step " << k;
      EXPECT_FALSE(reference[r].steps[k].update_delayed);
    }
    EXPECT_TRUE(run[r].steps[kPoisoned].skipped) << "rank " << r;
    // The staleness shows: the serial run without it ends elsewhere (the losses part after the
    // warm-up's first delayed update reaches the weights).
    EXPECT_NE(run[r].weights, serial[r].weights) << "rank " << r;
    EXPECT_EQ(run[r].losses[kWarmup + 1], reference[r].losses[kWarmup + 1]);
    EXPECT_NE(run[r].losses[kWarmup + 1], serial[r].losses[kWarmup + 1]) << "rank " << r;
  }
}

std::vector<Case> delayed_cases() {
  std::vector<Case> out;
  for (int stage : {1, 2, 3}) {
    for (int dp : {1, 2}) {
      for (DType dtype : {DType::f32, DType::bf16, DType::f16}) out.push_back({stage, dp, 1, dtype});
    }
  }
  for (int stage : {1, 2, 3}) {
    for (DType dtype : {DType::f32, DType::bf16}) out.push_back({stage, 2, 1, dtype, OffloadDevice::cpu});
  }
  // Gradients added up over micro-batches; parameters on the host or in swap files too.
  out.push_back({2, 2, 2, DType::bf16});
  out.push_back({3, 2, 2, DType::f16, OffloadDevice::nvme, OffloadDevice::nvme});
  out.push_back({3, 1, 1, DType::bf16, OffloadDevice::nvme, OffloadDevice::nvme});
  out.push_back({3, 2, 1, DType::f32, OffloadDevice::cpu, OffloadDevice::cpu});
  // Reduced in bf16, the gradients' file in bf16 too (Plan: swapped_grad_dtype).
  out.push_back({2, 2, 1, DType::bf16, OffloadDevice::nvme, OffloadDevice::none, DType::bf16});
  out.push_back({3, 2, 1, DType::bf16, OffloadDevice::nvme, OffloadDevice::nvme, DType::bf16});
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, DelayedUpdate, ::testing::ValuesIn(delayed_cases()), [](const auto& info) {
  const Case& c = info.param;
  return fmt::format("stage{}_dp{}_gas{}_{}_optimizer_{}_params_{}{}", c.stage, c.dp, c.gas, dtype_name(c.dtype),
                     offload_device_name(c.optimizer), offload_device_name(c.params),
                     c.reduction == DType::f32 ? "" : fmt::format("_reduced_{}", dtype_name(c.reduction)));
});

// A checkpoint publishes the update still running, so a run resumed from it continues exactly as
// the run that saved it (which published the same update at the same step), delayed from its
// first step as the warm-up is behind it.
TEST(DelayedUpdateCheckpoint, ResumedRunEqualsTheRunThatSaved) {
  const std::filesystem::path dir = testing::swap_dir() + "/delayed-ckpt";
  std::filesystem::remove_all(dir);
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Case c{2, 2, 1, dtype};
    FinalState unused;
    MlpRun whole = delayed_run(c, true, false, unused);
    whole.poison_step = -1;
    whole.inspect = nullptr;
    whole.save_after = 4;
    whole.checkpoint_dir = dir.string();
    const auto saved = run_ranks(2, whole);
    MlpRun resumed = whole;
    resumed.save_after = -1;
    resumed.resume = dir.string();
    const auto after = run_ranks(2, resumed);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(after[r].losses.size(), 4u);
      for (size_t k = 0; k < 4; ++k) EXPECT_EQ(after[r].losses[k], saved[r].losses[4 + k]) << dtype_name(dtype) << " step " << 4 + k;
      for (const auto& s : after[r].steps) EXPECT_TRUE(s.update_delayed);
      EXPECT_EQ(after[r].weights, saved[r].weights) << dtype_name(dtype) << " rank " << r;
    }
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace zeroth
