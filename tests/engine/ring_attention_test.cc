// Ring attention (context parallelism) against one rank: a tiny GPT-2 and Llama whose samples are
// cut into 2C chunks, rank r of a context group holding chunks r and 2C-1-r, keys and values passed
// around the group, train to what one rank computes for the same global batches (losses, gradient
// norms, every weight after 4 steps at a nonzero learning rate), under every ZeRO stage and composed
// with data, tensor and pipeline parallelism, experts and activation checkpointing. Each rank's
// positions are global ones (GPT-2's learned table read at both chunks' first positions, Llama's
// rotary table reordered to them); a loss mask that leaves the ranks unequal counts shows the loss
// is the mean over the global batch's targets.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "tests/engine/gpt_grid.h"

namespace zeroth {
namespace {

using testing::GridCase;

// 16 positions: 4 chunks of 4 at C = 2, 8 of 2 at C = 4. Of the Llama's 6 query and 2 key/value
// heads only the key/value heads travel.
using testing::split_gpt2;
using testing::split_llama_6_2;

GridCase with(GptConfig model, int context, int dp, int stage) {
  GridCase k;
  k.model = model, k.seq = context, k.ring = true, k.dp = dp, k.stage = stage;
  k.micro = 2;  // kGlobalBatch 8 = micro x dp x the micro-batch
  return k;
}

class RingEquivalence : public ::testing::TestWithParam<GridCase> {};

// Beyond the order of the products' and reductions' sums (as Ulysses'), the attention's own sums
// differ: each query's keys are met by blocks of a chunk and merged by their log-sum-exp, where one
// rank's kernel runs them by chunks of 128 keys in one online softmax. Ulysses' bound for Llama
// (4e-6 of each tensor's largest value) serves both models: GPT-2's worst, 3.1e-6 (masked at C = 4),
// is above Ulysses' 2e-6 for it.
TEST_P(RingEquivalence, TrainsLikeOneRank) { testing::expect_split_trains_like_one_rank(GetParam(), 4e-6); }

std::vector<GridCase> cases() {
  std::vector<GridCase> out;
  for (int stage : {0, 1, 2, 3}) {
    out.push_back(with(split_gpt2(), 2, 2, stage));
    out.push_back(with(split_llama_6_2(), 2, 2, stage));
  }
  out.push_back(with(split_gpt2(), 4, 1, 3));
  out.push_back(with(split_llama_6_2(), 4, 1, 1));
  // One sample a micro-batch.
  {
    GridCase k = with(split_llama_6_2(), 4, 1, 3);
    k.micro = 8;
    out.push_back(k);
  }
  // Unequal counts of targets over the ranks.
  for (GptConfig m : {split_gpt2(), split_llama_6_2()}) {
    GridCase k = with(m, 4, 1, 2);
    k.masked = true;
    out.push_back(k);
  }
  {
    GridCase k = with(split_llama_6_2(), 2, 1, 3);
    k.checkpointing = true;
    out.push_back(k);
    k.cpu_checkpointing = true;  // the checkpoints in host memory, as configs/llama-long-ring.json
    out.push_back(k);
  }
  // Two ring groups of 4 (ZeRO over all 8 ranks), and the optimizer offloaded to the CPU.
  out.push_back(with(split_gpt2(), 4, 2, 0));
  {
    GridCase k = with(split_llama_6_2(), 2, 2, 2);
    k.offload = OffloadDevice::cpu;
    out.push_back(k);
  }
  {
    // Tensor parallelism: each tensor-parallel rank's heads go round its own ring.
    GridCase k = with(split_gpt2(), 2, 1, 1);
    k.tp = 2;
    out.push_back(k);
    k.sequence_parallel = true;
    out.push_back(k);
  }
  {
    // Grouped-query attention's 3 query heads over 1 key/value head a tensor-parallel rank.
    GridCase k = with(split_llama_6_2(), 2, 1, 2);
    k.tp = 2;
    out.push_back(k);
  }
  for (GptConfig m : {split_gpt2(), split_llama_6_2()}) {
    GridCase k = with(m, 2, 1, 1);
    k.pp = 2, k.micro = 4;
    out.push_back(k);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Grid, RingEquivalence, ::testing::ValuesIn(cases()));

// Expert layers take a ring rank's rows as tokens like any other (dropless routing, no auxiliary
// losses: their balance is a micro-batch's), the experts shared over E = 2 of the dp x C ranks,
// against dp 2 alone.
TEST(RingExperts, TrainLikeDataParallelExperts) {
  GptConfig m = split_gpt2();
  m.moe.num_experts = 4, m.moe.top_k = 2, m.moe.every = 2, m.moe.drop_tokens = false, m.moe.aux_loss_coef = 0;
  const auto ref = testing::train_grid(with(m, 1, 2, 2));
  GridCase k = with(m, 2, 2, 2);
  k.ep = 2;
  const auto got = testing::train_grid(k);
  const auto [norm_err, loss_err] = testing::expect_steps(got, ref);
  const testing::TensorError w = testing::expect_weights(got, ref, 2e-6, m);
  std::printf("C 2 dp 2 E 2: worst relative error of a loss %.3g, of a gradient norm %.3g, of a tensor %.3g (%s)\n", loss_err,
              norm_err, w.rel(), w.name.c_str());
}

}  // namespace
}  // namespace zeroth
