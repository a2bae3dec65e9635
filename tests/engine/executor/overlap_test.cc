// Offloaded sub-groups updated during the backward pass (offload_optimizer.overlap_backward)
// against the serial step, which swaps each sub-group in, updates it and writes it back only after
// the global gradient norm is known. The speculation must not show: at stages 1-3, one and two
// ranks, f32, bf16 and f16, over steps where clipping bites (the sub-groups are updated again),
// steps where it does not (their result is kept) and a step that overflows (their parameters
// are put back), the losses, gradient norms, master weights and both moments are bit-identical.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <map>
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
  bool params_on_nvme = false;  // stage 3: offload_param on nvme too
  bool reduced_narrow = false;  // communication_data_type the compute dtype (the gradients' file keeps it)
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << "stage " << c.stage << ", dp " << c.dp << ", gas " << c.gas << ", " << dtype_name(c.dtype)
      << (c.params_on_nvme ? ", parameters on nvme" : "") << (c.reduced_narrow ? ", reduced in it" : "");
}

// Every rank's master weights and moments of every block after the last step, as the engine
// reads them back for a checkpoint (from the copy of the swap files the last step made current).
constexpr int kSteps = 8;

MlpRun overlap_run(const Case& c, bool overlap, double clipping, FinalState& state) {
  MlpRun run;
  run.stage = c.stage;
  run.gas = c.gas;
  run.dtype = c.dtype;
  run.steps = kSteps;
  // One step overflows on one rank, after steps that were neither clipped nor skipped (f16 lowers
  // its scale; f32 and bf16 skip the step all the same).
  run.poison_rank = c.dp - 1, run.poison_step = 5;
  run.tweak = [c, overlap, clipping](EngineConfig& e) {
    e.zero.sub_group_size = 1000;  // several sub-groups per bucket and per rank, slots reused
    e.gradient_clipping = clipping;
    e.zero.offload_optimizer.device = OffloadDevice::nvme;
    e.zero.offload_optimizer.nvme_path = testing::swap_dir();
    e.zero.offload_optimizer.overlap_backward = overlap;
    if (c.reduced_narrow) e.communication_dtype = c.dtype;
    if (c.params_on_nvme) {
      e.zero.offload_param.device = OffloadDevice::nvme;
      e.zero.offload_param.nvme_path = testing::swap_dir();
    }
  };
  run.inspect = state.keep_after(kSteps);
  return run;
}

class OverlapBackward : public ::testing::TestWithParam<Case> {};

TEST_P(OverlapBackward, EqualsTheSerialStepBitForBit) {
  const Case& c = GetParam();
  // The MLP's gradient norms run 2.46, 2.17, 2.55, 2.13, 2.12, then fall below 1.7: clipping at
  // 2.3 bites on steps 1 and 3 (both speculated: the first step is, and the one after an unclipped
  // step), and the steps from the fifth on are kept.
  constexpr double kClipping = 2.3;
  FinalState serial_state, overlap_state;
  const auto serial = run_ranks(c.dp, overlap_run(c, false, kClipping, serial_state));
  const auto overlapped = run_ranks(c.dp, overlap_run(c, true, kClipping, overlap_state));
  expect_same_training(overlapped, overlap_state, serial, serial_state);
  if (HasFatalFailure()) return;  // the runs' shapes differ: nothing below can be indexed
  for (int r = 0; r < c.dp; ++r) {
    for (const auto& step : serial[r].steps) EXPECT_EQ(step.speculation, Speculation::none) << "rank " << r;
  }
  // Every way a speculation ends happened on every rank: kept, done again after clipping, and
  // undone after an overflow.
  for (int r = 0; r < c.dp; ++r) {
    std::map<Speculation, int> mine;
    for (const auto& s : overlapped[r].steps) ++mine[s.speculation];
    EXPECT_GT(mine[Speculation::committed], 0) << "rank " << r;
    EXPECT_GT(mine[Speculation::redone], 0) << "rank " << r;
    EXPECT_EQ(mine[Speculation::restored], 1) << "rank " << r;
  }
}

std::vector<Case> overlap_cases() {
  std::vector<Case> out;
  for (int stage : {1, 2, 3}) {
    for (int dp : {1, 2}) {
      for (DType dtype : {DType::f32, DType::bf16, DType::f16}) out.push_back({stage, dp, 1, dtype});
    }
  }
  // Gradients added up over micro-batches before they are final; parameters in swap files too.
  out.push_back({2, 2, 2, DType::bf16});
  out.push_back({3, 2, 2, DType::f16, true});
  out.push_back({3, 1, 1, DType::bf16, true});
  // Gradients reduced in bf16 or f16 and kept so in their file: the redo reads them again.
  for (int stage : {1, 2, 3}) {
    for (DType dtype : {DType::bf16, DType::f16}) out.push_back({stage, 2, 1, dtype, false, true});
  }
  out.push_back({3, 1, 1, DType::bf16, true, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, OverlapBackward, ::testing::ValuesIn(overlap_cases()), [](const auto& info) {
  const Case& c = info.param;
  return fmt::format("stage{}_dp{}_gas{}_{}{}{}", c.stage, c.dp, c.gas, dtype_name(c.dtype), c.params_on_nvme ? "_params_nvme" : "",
                     c.reduced_narrow ? "_reduced_narrow" : "");
});

}  // namespace
}  // namespace zeroth
