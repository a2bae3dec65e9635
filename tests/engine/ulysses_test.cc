// Ulysses sequence parallelism against one rank: a tiny GPT-2 and Llama whose samples are split by
// positions over U ranks, the heads exchanged around the attention, train to what one rank computes
// for the same global batches (losses, gradient norms, every weight after 4 steps at a nonzero
// learning rate), under every ZeRO stage and composed with data, tensor and pipeline parallelism,
// experts and activation checkpointing. A loss mask that leaves the ranks unequal counts shows the
// model honours a global divisor (the harness sets the global batch's count of targets, as the run
// does: sft_train_test.cc checks the run's), so the loss is the mean over the global batch's
// targets, not a mean of the ranks' means.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "tests/engine/gpt_grid.h"

namespace zeroth {
namespace {

using testing::GridCase;

// split_gpt2: 4 heads of 8 channels, so U = 4 gives each rank one; 16 positions, 4 per rank at U = 4.
// split_llama_6_2: U = 2 splits both its 6 query and 2 key/value heads.
using testing::split_gpt2;
using testing::split_llama_6_2;

// 8 query heads over 2 key/value heads at U = 4: fewer key/value heads than ranks, so each rank
// takes a copy of the one its 2 query heads read, and their gradients sum over the copies.
GptConfig llama_8_2() {
  GptConfig c = split_llama_6_2();
  c.n_embd = 64, c.n_head = 8;
  return c;
}

GridCase with(GptConfig model, int seq, int dp, int stage) {
  GridCase k;
  k.model = model, k.seq = seq, k.dp = dp, k.stage = stage;
  k.micro = 2;  // kGlobalBatch 8 = micro x dp x the micro-batch
  return k;
}

class UlyssesEquivalence : public ::testing::TestWithParam<GridCase> {};

// Only the order of float sums differs from one rank: the products' rows in U pieces (BLAS blocks
// them by the row count), the weight gradients summed over the U ranks' rows by the data-parallel
// reduction. The attention itself runs on the same rows of each head.
TEST_P(UlyssesEquivalence, TrainsLikeOneRank) {
  const GridCase k = GetParam();
  // Llama's q/k/v biases start at zero and move 4 Adam steps (largest value 0.014): 8 micro-batches
  // of one sample each, summed in another order, move one 4.9e-8 (3.5e-6 of that).
  testing::expect_split_trains_like_one_rank(k, k.model.llama() ? 4e-6 : 2e-6);
}

std::vector<GridCase> cases() {
  std::vector<GridCase> out;
  for (int stage : {0, 1, 2, 3}) {
    out.push_back(with(split_gpt2(), 2, 2, stage));
    out.push_back(with(split_llama_6_2(), 2, 2, stage));
  }
  out.push_back(with(split_gpt2(), 4, 1, 3));
  out.push_back(with(llama_8_2(), 4, 1, 1));
  // One sample a micro-batch: the exchanges receive straight into the heads' layout.
  for (GptConfig m : {split_gpt2(), llama_8_2()}) {
    GridCase k = with(m, m.llama() ? 4 : 2, m.llama() ? 1 : 2, 3);
    k.micro = 8 / k.dp;
    out.push_back(k);
  }
  // Unequal counts of targets over the ranks (the last rank of 4 holds none). With Llama's 8/2
  // heads at U = 4 the copies of a key/value head sum their gradients in another order than one
  // rank's kernel does, and under Adam one element of embed.wte whose gradient nearly cancels moves
  // 3.1e-5 (4e-4 of the largest value; Adam divides it by its own root square): SGD there shows
  // the gradients themselves match (1.4e-6).
  for (GptConfig m : {split_gpt2(), split_llama_6_2(), llama_8_2()}) {
    GridCase k = with(m, m.n_head == 6 ? 2 : 4, m.n_head == 6 ? 2 : 1, 2);
    k.masked = true;
    if (m.n_head == 8) k.optimizer = OptimizerKind::sgd;
    out.push_back(k);
  }
  // Packed rows (samples of 5, 7 and 4 positions): a sample crosses from one rank's positions to the
  // next one's; GPT-2's learned positions restart inside a rank's rows, Llama's rotary ones in the
  // heads' layout over every position.
  for (GptConfig m : {split_gpt2(), split_llama_6_2(), llama_8_2()}) {
    GridCase k = with(m, m.n_head == 6 ? 2 : 4, 1, 1);
    k.packed = true;
    out.push_back(k);
  }
  {
    GridCase k = with(split_llama_6_2(), 2, 1, 3);
    k.checkpointing = true;
    out.push_back(k);
  }
  {
    // Tensor parallelism under the exchange: each tensor-parallel rank's 2 heads over U = 2.
    GridCase k = with(split_gpt2(), 2, 1, 1);
    k.tp = 2;
    out.push_back(k);
    k.sequence_parallel = true;
    out.push_back(k);
  }
  {
    GridCase k = with(split_llama_6_2(), 2, 1, 1);
    k.pp = 2, k.micro = 4;
    out.push_back(k);
  }
  {
    // Grouped-query attention under both splits, 8 query over 4 key/value heads: tp 2 leaves a rank
    // 4 over 2, which U = 2 splits (one key/value head each) and U = 4 copies (each rank one query
    // head and a copy of its key/value head); U = 2 alone gives each rank 2 key/value heads.
    GptConfig m = llama_8_2();
    m.n_kv_head = 4;
    for (int seq : {2, 4}) {
      GridCase k = with(m, seq, 1, 2);
      k.tp = 2;
      out.push_back(k);
    }
    out.push_back(with(m, 2, 2, 3));
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Grid, UlyssesEquivalence, ::testing::ValuesIn(cases()));

// Expert layers under Ulysses take a rank's positions as tokens like any other: dropless routing
// (capacity would cut each rank's share of a micro-batch, not the micro-batch) without the auxiliary
// losses (their balance is a micro-batch's, here a rank's share), the experts shared over E = 2 of
// the dp x U ranks, against dp 2 alone with the same routing.
TEST(UlyssesExperts, TrainLikeDataParallelExperts) {
  GptConfig m = split_gpt2();
  m.moe.num_experts = 4, m.moe.top_k = 2, m.moe.every = 2, m.moe.drop_tokens = false, m.moe.aux_loss_coef = 0;
  GridCase base = with(m, 1, 2, 2);
  const auto ref = testing::train_grid(base);
  for (int ep : {1, 2}) {
    GridCase k = with(m, 2, 2, 2);
    k.ep = ep;
    SCOPED_TRACE(::testing::PrintToString(k));
    const auto got = testing::train_grid(k);
    const auto [norm_err, loss_err] = testing::expect_steps(got, ref);
    const testing::TensorError w = testing::expect_weights(got, ref, 2e-6, m);
    std::printf("U 2 dp 2 E %d: worst relative error of a loss %.3g, of a gradient norm %.3g, of a tensor %.3g (%s)\n", ep, loss_err,
                norm_err, w.rel(), w.name.c_str());
  }
}

}  // namespace
}  // namespace zeroth
