// Lamb in the engine: every stage and world size trains the MLP to what one rank at stage 0
// computes, which holds only if each tensor's trust ratio is formed from the whole tensor (its
// pieces on every rank and sub-group summed), not per shard; and the plan says so in its actions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "comm/local/local_comm.h"
#include "engine/plan/plan.h"
#include "tests/engine/mlp_harness.h"

namespace zeroth {
namespace {

using testing::MlpRun;
using testing::RankResult;
using testing::run_ranks;

struct LambCase {
  int stage, dp;
  uint64_t sub_group_size;
  DType dtype = DType::f32;
};
void PrintTo(const LambCase& c, std::ostream* os) {
  *os << "stage " << c.stage << ", dp " << c.dp << ", sub_group_size " << c.sub_group_size << ", " << dtype_name(c.dtype);
}

MlpRun lamb_run(int stage, uint64_t sub_group_size, DType dtype) {
  MlpRun run;
  run.stage = stage;
  run.dtype = dtype;
  run.tweak = [sub_group_size](EngineConfig& c) {
    c.optimizer.kind = OptimizerKind::lamb;
    c.optimizer.weight_decay = 0.01;
    c.zero.sub_group_size = sub_group_size;
  };
  return run;
}

class LambEquivalence : public ::testing::TestWithParam<LambCase> {};

// As the AdamW equivalence: only the order of float sums differs (the batch split across ranks,
// the bucketed reduction, the norms summed per piece), so 1e-6 of the largest weight after 4 steps
// in f32 (bf16: gradients rounded per micro-batch, one bf16 ulp). A ratio per shard moves the
// weights of a split tensor by ~1e-3 of the largest instead.
TEST_P(LambEquivalence, TrainsLikeOneRankStageZero) {
  const auto c = GetParam();
  static const RankResult ref_f32 = run_ranks(1, lamb_run(0, 1'000'000'000, DType::f32))[0];
  static const RankResult ref_bf16 = run_ranks(1, lamb_run(0, 1'000'000'000, DType::bf16))[0];
  const RankResult& ref = c.dtype == DType::f32 ? ref_f32 : ref_bf16;
  const double bound = c.dtype == DType::f32 ? 1e-6 : 0x1.0p-8;
  const auto ranks = run_ranks(c.dp, lamb_run(c.stage, c.sub_group_size, c.dtype));
  for (int r = 0; r < c.dp; ++r) {
    double diff = 0, scale = 0;
    for (size_t b = 0; b < ref.weights.size(); ++b) {
      for (size_t i = 0; i < ref.weights[b].size(); ++i) {
        diff = std::max(diff, std::abs(static_cast<double>(ranks[r].weights[b][i]) - ref.weights[b][i]));
        scale = std::max(scale, std::abs(static_cast<double>(ref.weights[b][i])));
      }
    }
    EXPECT_LE(diff / scale, bound) << "rank " << r;
    if (r == 0)
      std::printf("Lamb stage %d dp %d sub_group_size %llu %s: weights %.3g\n", c.stage, c.dp,
                  static_cast<unsigned long long>(c.sub_group_size), std::string(dtype_name(c.dtype)).c_str(), diff / scale);
  }
  double first = 0, last = 0;
  for (const auto& r : ranks) first += r.losses.front(), last += r.losses.back();
  EXPECT_LT(last, first) << "training must make progress";
}

std::vector<LambCase> lamb_cases() {
  std::vector<LambCase> out;
  for (int stage : {0, 1, 2, 3}) {
    for (int dp : {1, 2, 4}) out.push_back({stage, dp, 1'000'000'000});
  }
  // Sub-groups of 100 elements split every weight matrix across several updates too.
  out.push_back({2, 1, 100});
  out.push_back({1, 2, 100});
  out.push_back({3, 4, 100});
  // Narrow parameters: the second pass writes them from the f32 master weights.
  for (int stage : {0, 2, 3}) out.push_back({stage, 2, 1'000'000'000, DType::bf16});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Stages, LambEquivalence, ::testing::ValuesIn(lamb_cases()), [](const auto& info) {
  const auto& c = info.param;
  return "stage" + std::to_string(c.stage) + "_dp" + std::to_string(c.dp) + (c.sub_group_size < 1000 ? "_small_sub_groups" : "") +
         "_" + std::string(dtype_name(c.dtype));
});

// Spans name the tensor they lie in and never cross one; the step runs every first pass, sums the
// norms over the ranks when they split tensors (stages 1-3 at dp > 1), then the updates.
TEST(LambPlan, StepProgramSumsPerTensorNormsBeforeTheUpdates) {
  std::vector<BlockSpec> blocks(2);
  blocks[0].name = "a";
  blocks[0].params = {{"w", {10, 30}, InitRule::zeros(), ParamRole::weight}, {"b", {10}, InitRule::zeros(), ParamRole::bias}};
  blocks[1].name = "b";
  blocks[1].params = {{"w", {20, 10}, InitRule::zeros(), ParamRole::weight}};
  EngineConfig config;
  config.optimizer.kind = OptimizerKind::lamb;
  config.zero.sub_group_size = 64;
  for (int stage : {0, 2}) {
    config.zero.stage = stage;
    const Plan p = make_plan(blocks, default_schedule(2), config, 2, 1);
    ASSERT_GE(p.tensor_norms, 0);
    EXPECT_EQ(p.buffers[p.tensor_norms].numel, 6u) << "a pair per tensor";
    for (const auto& g : p.sub_groups) {
      for (const auto& s : g) {
        const auto& offs = p.blocks[s.block].param_offsets;
        const int first = s.block == 0 ? 0 : 2;
        ASSERT_GE(s.tensor, first);
        const size_t i = static_cast<size_t>(s.tensor - first);
        const size_t end = i + 1 < offs.size() ? offs[i + 1] : p.blocks[s.block].padded;
        EXPECT_TRUE(s.lo >= offs[i] && s.hi <= end)
            << "span [" << s.lo << ", " << s.hi << ") of block " << s.block << " leaves tensor " << s.tensor;
      }
    }
    std::vector<ActionKind> kinds;
    for (const auto& a : p.step_program) kinds.push_back(a.kind());
    const auto first_update = std::find(kinds.begin(), kinds.end(), ActionKind::update);
    const auto sum = std::find(kinds.begin(), kinds.end(), ActionKind::sum_norms);
    EXPECT_EQ(sum != kinds.end(), stage >= 1) << "stage " << stage;
    EXPECT_EQ(std::count(kinds.begin(), first_update, ActionKind::update_norms), static_cast<long>(p.sub_groups.size()));
    EXPECT_EQ(std::count(first_update, kinds.end(), ActionKind::update_norms), 0);
    EXPECT_TRUE(sum == kinds.end() || sum < first_update) << "the norms are summed before the first update";
  }
}

}  // namespace
}  // namespace zeroth
