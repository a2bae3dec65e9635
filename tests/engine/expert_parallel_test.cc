// Expert parallelism against the same data-parallel ranks without it: 4 ranks with their experts
// shared out over E = 2 or 4 of them train, at every ZeRO stage, the losses, gradient norms and
// weights the 4 ranks train with every expert on every rank (E = 1). Each micro-batch is routed on
// its own rank either way; E moves where an expert's rows are multiplied (and its gradient summed),
// so the runs differ by the order of f32 sums only. A router forced to send every token to one
// expert leaves the other ranks' experts without rows: every rank still finishes every step. A
// checkpoint saved at one E loads at another.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "tests/engine/gpt_grid.h"

namespace zeroth::testing {
namespace {

// 4 layers, every other one an expert layer of 4 experts, top-2 with capacity (the DeepSpeed rule
// drops choices past ceil(16 x 2 / 4) = 8 rows per expert in each 16-token micro-batch).
GptConfig moe_gpt() {
  GptConfig c = tiny_gpt();
  c.n_layer = 4;
  c.moe.num_experts = 4, c.moe.top_k = 2, c.moe.every = 2, c.moe.capacity_factor = 1.0;
  return c;
}

GridCase moe_case(int stage, int ep, bool forced = false) {
  GridCase k;
  k.dp = 4, k.micro = 2, k.stage = stage, k.ep = ep, k.force_one_expert = forced;
  k.model = moe_gpt();
  return k;
}

// f32 sums in another order move a loss by an ulp or so (1.4e-8 measured) and the gradient norm by a
// few (8e-8); Adam turns rounding of near-zero gradients into steps of up to lr (1e-3 in
// tiny_gpt_engine) either way, 1.8e-6 of a tensor's largest value measured after 4 steps. An
// expert's gradient added to another's weights moves the gradient norm by 5e-3 and the weights by
// whole steps.
constexpr double kNormBound = 1e-6, kLossBound = 2e-7, kWeightBound = 5e-5;

class ExpertParallel : public ::testing::TestWithParam<int> {};

TEST_P(ExpertParallel, TwoAndFourRanksOfExpertsTrainWhatOneTrains) {
  const int stage = GetParam();
  const GridResult one = train_grid(moe_case(stage, 1));
  for (int ep : {2, 4}) {
    SCOPED_TRACE(::testing::Message() << "E = " << ep);
    const GridResult got = train_grid(moe_case(stage, ep));
    const auto [norm_err, loss_err] = expect_steps(got, one, kNormBound, kLossBound);
    const TensorError w = expect_weights(got, one, kWeightBound, moe_gpt());
    std::printf("zero %d, E = %d: worst relative error of a loss %.3g, of a gradient norm %.3g, of a tensor %.3g (%s)\n", stage, ep,
                loss_err, norm_err, w.rel(), w.name.c_str());
  }
}

// Every token's choices on experts 0 and 1: with E = 2 and 4 the ranks holding experts 2 and 3 get
// no rows in any pass, and still join every all-to-all, gather and reduction.
TEST_P(ExpertParallel, OneExpertForcedFinishesEveryStepAndTrainsWhatOneRankOfExpertsTrains) {
  const int stage = GetParam();
  const GridResult one = train_grid(moe_case(stage, 1, true));
  for (int ep : {2, 4}) {
    SCOPED_TRACE(::testing::Message() << "E = " << ep);
    const GridResult got = train_grid(moe_case(stage, ep, true));
    ASSERT_EQ(got.losses.size(), static_cast<size_t>(kSteps));
    // Forced: expert 0 keeps 8 of the 16 first choices, expert 1 8 of the second ones, half dropped;
    // the busiest expert holds 8 rows against a mean of 4.
    EXPECT_EQ(got.moe.passes, 2 * 2 * kSteps);
    EXPECT_EQ(got.moe.dropped * 2, got.moe.choices);
    EXPECT_EQ(got.moe.max_load, 2.0);
    expect_steps(got, one, kNormBound, kLossBound);
    expect_weights(got, one, kWeightBound, moe_gpt());
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ExpertParallel, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return std::string("zero") + std::to_string(info.param); });

// With a pipeline: dp 2 x pp 2, the experts of each stage's expert layer shared over the stage's two
// data-parallel ranks.
TEST(ExpertParallelPipeline, TwoStagesTrainWhatTheyTrainWithoutExpertParallelism) {
  GridCase k = moe_case(1, 1);
  k.dp = 2, k.pp = 2, k.micro = 4;
  const GridResult one = train_grid(k);
  k.ep = 2;
  const GridResult got = train_grid(k);
  expect_steps(got, one, kNormBound, kLossBound);
  expect_weights(got, one, kWeightBound, moe_gpt());
}

// Saved after 2 steps with the experts over 4 ranks, loaded with them over 2 (and over 1), the last
// 2 steps give what 4 steps at E = 1 give.
TEST(ExpertParallelCheckpoint, SavedAtOneExpertSplitLoadsAtAnother) {
  const std::string dir = ::testing::TempDir() + "zeroth-ep-ckpt";
  std::filesystem::remove_all(dir);
  const GridResult one = train_grid(moe_case(2, 1));
  train_grid(moe_case(2, 4), nullptr, {0, 2, "", dir});
  for (int ep : {2, 1}) {
    SCOPED_TRACE(::testing::Message() << "loaded at E = " << ep);
    const GridResult got = train_grid(moe_case(2, ep), nullptr, {2, 4, dir, ""});
    ASSERT_EQ(got.losses.size(), 2u);
    for (size_t s = 0; s < 2; ++s) EXPECT_NEAR(got.losses[s], one.losses[2 + s], kLossBound * one.losses[2 + s]) << "step " << 2 + s;
    expect_weights(got, one, kWeightBound, moe_gpt());
  }
}

}  // namespace
}  // namespace zeroth::testing
