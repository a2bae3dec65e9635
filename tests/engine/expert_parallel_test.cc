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

// The plan of rank 3 of 4 with the experts over runs of 2: its expert blocks (slice 1) are
// partitioned over the 2 ranks holding that slice (it is member 1 of them), the dense blocks over
// all 4; expert blocks fill buckets of their own. What cannot be planned is refused.
TEST(ExpertParallelPlan, ExpertBlocksArePartitionedOverTheRanksHoldingTheirSlice) {
  GptPart part;
  part.ep_ranks = 2, part.ep_rank = 1;
  const auto specs = Gpt::block_specs(moe_gpt(), part);
  const auto schedules = Gpt::schedules(moe_gpt(), part);
  const Plan p = make_plan(specs, schedules, tiny_gpt_engine(2, 1), 4, 3, {});
  EXPECT_EQ(p.ep, 2);
  int experts = 0;
  for (size_t b = 0; b < p.blocks.size(); ++b) {
    const auto& blk = p.blocks[b];
    const int block = static_cast<int>(b);
    EXPECT_EQ(blk.expert, specs[b].name.ends_with(".experts")) << blk.name;
    EXPECT_EQ(p.group_ranks(block), blk.expert ? 2 : 4) << blk.name;
    EXPECT_EQ(p.group_rank(block), blk.expert ? 1 : 3) << blk.name;
    EXPECT_EQ(blk.shard * static_cast<size_t>(p.group_ranks(block)), blk.padded) << blk.name;
    EXPECT_EQ(p.range(StateKind::master, block).lo, static_cast<size_t>(p.group_rank(block)) * blk.shard) << blk.name;
    for (int other : p.reduce_buckets[blk.reduce_bucket].blocks) EXPECT_EQ(p.blocks[other].expert, blk.expert) << blk.name;
    experts += blk.expert ? 1 : 0;
  }
  EXPECT_EQ(experts, 2);  // layers 1 and 3
  EXPECT_EQ(specs[3].name, "h.1.experts");
  EXPECT_EQ(specs[3].params.front().name, "mlp.experts.2.c_fc.weight") << "slice 1 holds experts 2 and 3";
  EngineConfig lamb = tiny_gpt_engine(1, 1);
  lamb.optimizer.kind = OptimizerKind::lamb;
  EXPECT_THROW(make_plan(specs, schedules, lamb, 4, 3, {}), ConfigError);
  lamb.zero.stage = 0;  // each rank owns its tensors whole: no norms summed over ranks
  EXPECT_NO_THROW(make_plan(specs, schedules, lamb, 4, 3, {}));
  EXPECT_THROW(make_plan(specs, schedules, tiny_gpt_engine(2, 1), 3, 1, {}), ConfigError) << "2 does not divide 3 ranks";
}

// f32 sums in another order move a loss by an ulp or so (1.4e-8 measured) and the gradient norm by a
// few (8.3e-8); Adam turns rounding of near-zero gradients into steps of up to lr (1e-3 in
// tiny_gpt_engine) either way, 1.8e-6 of a tensor's largest value measured after 4 steps. An
// expert's gradient added to another's weights moves the gradient norm by 5e-3 and the weights by
// whole steps.
constexpr double kNormBound = 5e-7, kLossBound = 1e-7, kWeightBound = 2e-5;

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

// With a pipeline: dp 4 x pp 2, the experts of each stage's expert layer shared over runs of two of
// the stage's four data-parallel ranks (each slice's gradients reduced over the other two).
TEST(ExpertParallelPipeline, TwoStagesTrainWhatTheyTrainWithoutExpertParallelism) {
  GridCase k = moe_case(1, 1);
  k.dp = 4, k.pp = 2, k.micro = 2;
  const GridResult one = train_grid(k);
  k.ep = 2;
  const GridResult got = train_grid(k);
  expect_steps(got, one, kNormBound, kLossBound);
  expect_weights(got, one, kWeightBound, moe_gpt());
}

// DeepSpeed's "parameters" partition weighs each stage by what a rank holds: with 16 experts of 256
// in layer 3 of 4 (64 wide), that layer holds 11x a dense one's parameters and takes a stage alone
// ({3, 1}); shared over 16 ranks each holds one expert, the layer weighs about a dense one, and the
// stages even out ({2, 2}: the embedding on the first, its tied copy on the last).
TEST(ExpertParallelPipeline, StagesBalanceWhatARankHoldsOfEachExpertLayer) {
  GptConfig c = tiny_gpt();
  c.n_layer = 4, c.n_embd = 64, c.n_head = 2;
  c.moe.num_experts = 16, c.moe.top_k = 1, c.moe.every = 4;
  EXPECT_EQ(partition_layers(c, 2, "parameters"), (std::vector<int>{3, 1}));
  EXPECT_EQ(partition_layers(c, 2, "parameters", {}, 16), (std::vector<int>{2, 2}));
}

// Saved after 2 steps with the experts over 4 ranks, loaded with them over 2 and over 1, and saved
// at E = 1 and loaded at 4: the last 2 steps give what 4 steps at E = 1 give.
TEST(ExpertParallelCheckpoint, SavedAtOneExpertSplitLoadsAtAnother) {
  const std::string four = ::testing::TempDir() + "zeroth-ep-ckpt-4", one_dir = ::testing::TempDir() + "zeroth-ep-ckpt-1";
  std::filesystem::remove_all(four);
  std::filesystem::remove_all(one_dir);
  const GridResult one = train_grid(moe_case(2, 1));
  train_grid(moe_case(2, 4), nullptr, {0, 2, "", four});
  train_grid(moe_case(2, 1), nullptr, {0, 2, "", one_dir});
  for (const auto& [from, ep] : {std::pair{four, 2}, std::pair{four, 1}, std::pair{one_dir, 4}}) {
    SCOPED_TRACE(::testing::Message() << "from " << from << ", loaded at E = " << ep);
    const GridResult got = train_grid(moe_case(2, ep), nullptr, {2, 4, from, ""});
    ASSERT_EQ(got.losses.size(), 2u);
    for (size_t s = 0; s < 2; ++s) EXPECT_NEAR(got.losses[s], one.losses[2 + s], kLossBound * one.losses[2 + s]) << "step " << 2 + s;
    expect_weights(got, one, kWeightBound, moe_gpt());
  }
}

// The paths the cases above leave out: activation checkpointing (the experts' backward first, from
// their kept input, before the layer is recomputed), the Llama family's SwiGLU experts, and the
// optimizer offloaded to host memory (the expert buckets' slices taken to the host from their own
// group's reduction), at E = 2 against E = 1.
TEST(ExpertParallelVariants, CheckpointingSwigluExpertsAndOffloadTrainWhatOneRankOfExpertsTrains) {
  GridCase ckpt = moe_case(3, 1);
  ckpt.checkpointing = true;
  GridCase llama = moe_case(1, 1);
  llama.model.architecture = Architecture::llama;
  GridCase offload = moe_case(2, 1);
  offload.offload = OffloadDevice::cpu;
  for (GridCase k : {ckpt, llama, offload}) {
    SCOPED_TRACE(::testing::PrintToString(k));
    const GridResult ref = train_grid(k);
    k.ep = 2;
    const GridResult got = train_grid(k);
    expect_steps(got, ref, kNormBound, kLossBound);
    expect_weights(got, ref, kWeightBound, k.model);
  }
}

// With tensor parallelism the router and the experts are replicated over the group: each rank routes
// and computes every token (with sequence parallelism from the gathered rows, keeping its own), and
// the gradients at the layer's input are whole on every rank, not partial sums. dp 2 x tp 2 (also
// with E = 2 and sequence parallelism) against dp 2 alone: the attention's split sums in another
// order (tensor_parallel_test.cc's bounds; 1.6e-6 of a tensor's largest value measured), the
// replicas stay equal. Summing the whole gradients over the group instead fails the norms' bound.
TEST(ExpertParallelTensor, ExpertsReplicatedOverTensorRanksTrainWhatTheyTrainWithoutThem) {
  GridCase base = moe_case(2, 1);
  base.dp = 2;
  const GridResult ref = train_grid(base);
  GridCase tp = base;
  tp.tp = 2;
  GridCase sp = tp;
  sp.sequence_parallel = true, sp.ep = 2;
  for (const GridCase& k : {tp, sp}) {
    SCOPED_TRACE(::testing::PrintToString(k));
    const GridResult got = train_grid(k);
    EXPECT_TRUE(got.replica_mismatches.empty())
        << "replicated parameters differ between tensor-parallel ranks: " << got.replica_mismatches.front();
    const auto [norm_err, loss_err] = expect_steps(got, ref, 5e-7, 3e-7);
    const TensorError w = expect_weights(got, ref, 3e-6, k.model);
    std::printf("tp 2%s, E = %d: worst relative error of a loss %.3g, of a gradient norm %.3g, of a tensor %.3g (%s)\n",
                k.sequence_parallel ? " sp" : "", k.ep, loss_err, norm_err, w.rel(), w.name.c_str());
  }
}

// The all-to-alls on their own stream, under the experts' products (slot j + 1's rows arriving while
// slot j computes, the input gradients leaving before the weight gradients are made), against the
// same exchanges in turn on the compute stream: the same products on the same rows, so the same
// bits. Each hand-over is made to matter: a link model holds each exchange for 2 ms after its
// copies, so products that did not wait for their rows read the previous layer's or pass's (shown
// to fail: without the hand-over before a slot's products the first step's loss already differs);
// experts 8192 wide without the link take milliseconds per slot, so results sent before they were
// made would be the previous pass's (shown to fail without the exchange stream's wait for a slot's
// results).
TEST(ExpertParallelOverlap, AllToAllsUnderTheProductsGiveTheSerialBits) {
  GridCase plain = moe_case(2, 2);
  plain.link = {2000, 0};
  GridCase ckpt = moe_case(3, 2);
  ckpt.checkpointing = true, ckpt.link = {2000, 0};
  GridCase llama = moe_case(1, 4);
  llama.model.architecture = Architecture::llama;
  llama.model.moe.num_experts = 8;  // two slots per rank at E = 4
  llama.link = {2000, 0};
  GridCase wide = moe_case(2, 2);
  wide.model.moe.intermediate_size = 8192;
  for (GridCase k : {plain, ckpt, llama, wide}) {
    SCOPED_TRACE(::testing::PrintToString(k));
    k.ep_overlap = false;
    const GridResult serial = train_grid(k);
    k.ep_overlap = true;
    const GridResult got = train_grid(k);
    EXPECT_EQ(got.losses, serial.losses);
    EXPECT_EQ(got.grad_norms, serial.grad_norms);
    ASSERT_EQ(got.weights.size(), serial.weights.size());
    for (const auto& [name, w] : serial.weights) EXPECT_TRUE(got.weights.at(name) == w) << name;
  }
}

}  // namespace
}  // namespace zeroth::testing
