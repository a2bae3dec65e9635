// The ZeRO engine against itself: every stage, world size and accumulation setting must train the
// MLP to what dp=1 stage 0 computes for the same global batch; memory and traffic must match the
// plan and the ZeRO paper; overflow and budget failures must behave.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "comm/local/local_comm.h"
#include "tests/engine/mlp_harness.h"

namespace zeroth {
namespace {

using testing::MlpRun;
using testing::RankResult;

std::vector<RankResult> run_ranks(int dp, const MlpRun& run) {
  std::vector<RankResult> results(dp);
  run_local_ranks(dp, [&](Communicator& comm) { results[comm.rank()] = testing::train_mlp(comm, run); });
  return results;
}

// Mean over ranks of each step's loss: the global batch's loss.
std::vector<double> global_losses(const std::vector<RankResult>& ranks) {
  std::vector<double> out(ranks[0].losses.size(), 0.0);
  for (const auto& r : ranks) {
    for (size_t k = 0; k < out.size(); ++k) out[k] += r.losses[k] / ranks.size();
  }
  return out;
}

// Largest |a - b| over the model, relative to the largest |b|.
double weight_error(const RankResult& a, const RankResult& b) {
  double diff = 0, scale = 0;
  for (size_t blk = 0; blk < b.weights.size(); ++blk) {
    for (size_t i = 0; i < b.weights[blk].size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(a.weights[blk][i]) - b.weights[blk][i]));
      scale = std::max(scale, std::abs(static_cast<double>(b.weights[blk][i])));
    }
  }
  return diff / scale;
}

const RankResult& reference(DType dtype) {
  static std::mutex mutex;
  static std::map<DType, RankResult> cache;
  std::lock_guard lock(mutex);
  if (!cache.contains(dtype)) {
    MlpRun run;
    run.dtype = dtype;
    cache[dtype] = run_ranks(1, run)[0];
  }
  return cache[dtype];
}

struct Case {
  int stage, dp, gas;
  DType dtype;
};

class Equivalence : public ::testing::TestWithParam<Case> {};

// f32: the only differences are the order of float sums (the batch split across ranks and
// micro-steps, the bucketed reduction): 1e-6 of the largest weight after 4 Adam steps.
// bf16: gradients are rounded to bf16 per micro-batch before they are summed, so a different
// split rounds differently; one bf16 ulp (2^-8) of the largest weight.
TEST_P(Equivalence, TrainsLikeOneRankStageZero) {
  const auto c = GetParam();
  MlpRun run;
  run.stage = c.stage;
  run.gas = c.gas;
  run.dtype = c.dtype;
  const auto ranks = run_ranks(c.dp, run);
  const auto& ref = reference(c.dtype);
  const double bound = c.dtype == DType::f32 ? 1e-6 : 0x1.0p-8;
  const auto losses = global_losses(ranks);
  for (size_t k = 0; k < losses.size(); ++k) {
    EXPECT_NEAR(losses[k], ref.losses[k], bound * std::abs(ref.losses[k])) << "step " << k;
  }
  for (int r = 0; r < c.dp; ++r) {
    const double err = weight_error(ranks[r], ref);
    EXPECT_LE(err, bound) << "rank " << r;
    if (r == 0) std::printf("stage %d dp %d gas %d %s: weights %.3g, loss %.3g -> %.3g\n", c.stage, c.dp, c.gas,
                            std::string(dtype_name(c.dtype)).c_str(), err, losses.front(), losses.back());
    EXPECT_EQ(ranks[r].steps.size(), 4u);
  }
  EXPECT_LT(losses.back(), losses.front()) << "training must make progress";
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (int stage : {0, 1, 2, 3}) {
    for (int dp : {1, 2, 4}) {
      for (int gas : {1, 3}) out.push_back({stage, dp, gas, DType::f32});
    }
    out.push_back({stage, 4, 1, DType::bf16});
    out.push_back({stage, 2, 3, DType::bf16});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Stages, Equivalence, ::testing::ValuesIn(all_cases()), [](const auto& info) {
  const auto& c = info.param;
  return "stage" + std::to_string(c.stage) + "_dp" + std::to_string(c.dp) + "_gas" + std::to_string(c.gas) + "_" +
         std::string(dtype_name(c.dtype));
});

}  // namespace
}  // namespace zeroth
