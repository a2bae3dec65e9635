// The planner's mixture of experts against what it counts independently: Mixtral 8x7B's published
// total and active parameters, models/decoder's own count of an expert GPT-2 (built from its parameter
// specs), the ZeRO paper's formulas over the dense ranks and over the expert-data-parallel ones
// worked out by hand, and the all-to-all's bytes over the link in closed form. The search finds
// expert parallelism where only it fits, and never where there are no experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include <cstdint>

#include "core/error.h"
#include "models/decoder/gpt.h"
#include "planner/model_states.h"
#include "planner/planner.h"

namespace zeroth {
namespace {

constexpr uint64_t GiB = 1ull << 30;

GptShape mixtral_8x7b() {
  // Mixtral-8x7B-v0.1's config.json: 32 layers, hidden 4096, 32 heads, 8 key/value heads, experts
  // of 14336, vocabulary 32000, untied head, 8 experts, 2 per token.
  GptShape s = GptShape::llama_shape(32, 4096, 32, 8, 14336, 4096, 32000, false);
  s.experts = 8, s.top_k = 2;
  return s;
}

TEST(MoeShape, CountsMixtralAndTheModelsOwnExperts) {
  const GptShape m = mixtral_8x7b();
  EXPECT_EQ(m.params(), 46'702'792'704u);         // Mistral AI: 46.7B
  EXPECT_EQ(m.active_params(), 12'879'925'248u);  // 12.9B per token
  // GPT-2 with experts of 512 in every second layer, against the model's parameter specs.
  GptConfig g;
  g.n_layer = 4, g.n_embd = 256, g.n_head = 4, g.seq_len = 128, g.vocab_size = 256;
  g.moe.num_experts = 8, g.moe.top_k = 2, g.moe.every = 2, g.moe.intermediate_size = 512;
  GptShape s{4, 256, 4, 128, 256};
  s.experts = 8, s.top_k = 2, s.moe_every = 2, s.expert_ffn = 512;
  EXPECT_EQ(s.moe_layers(), 2u);
  EXPECT_EQ(s.params(), g.num_parameters());
  EXPECT_EQ(s.active_params(), g.active_parameters());
  // Without experts the shape is the dense one.
  GptShape dense = s;
  dense.experts = 0;
  EXPECT_EQ(dense.params(), dense.active_params());
  EXPECT_EQ(dense.params(), 4 * dense.layer_params() + 256 * 256 + 128 * 256 + 2 * 256);
}

TEST(MoeShape, ExpertsAreShardedOverTheRanksHoldingTheSame) {
  const GptShape m = mixtral_8x7b();
  Layout l;
  l.dp = 16, l.ep = 4, l.stage = 2, l.micro_batches = 4;
  const LayoutMemory mem = layout_memory(m, l);
  // Each GPU holds 2 of each layer's 8 experts (3 h X each) and the rest whole.
  const uint64_t expert = 3ull * 4096 * 14336;
  EXPECT_EQ(mem.expert_params, 32 * 2 * expert);
  EXPECT_EQ(mem.stage_params - mem.expert_params, m.params() - 32 * 8 * expert);
  // ZeRO-2: 2 P + 14 P / N of the dense parameters over 16 ranks, of the experts over 16 / 4.
  const uint64_t dense = mem.stage_params - mem.expert_params;
  EXPECT_EQ(mem.model_states, zero_model_states(dense, 2, 16).device + zero_model_states(mem.expert_params, 2, 4).device);
  EXPECT_EQ(zero_model_states(mem.expert_params, 2, 4).device, 2 * mem.expert_params + 14 * mem.expert_params / 4);
  // With tensor parallelism the attention splits and the router and experts stay whole.
  Layout t = l;
  t.tp = 2, t.dp = 8;
  EXPECT_EQ(layout_memory(m, t).expert_params, mem.expert_params);
  // Mixtral's attention (q, o: h x h; k, v: h x 1024) halves; its two norms and the 8 x h router stay.
  EXPECT_EQ(m.moe_layer_shared_params(), 2ull * 4096 * 4096 + 2ull * 4096 * 1024 + 2 * 4096 + 8 * 4096);
  EXPECT_EQ(m.moe_layer_shared_slice(2), (2ull * 4096 * 4096 + 2ull * 4096 * 1024) / 2 + 2 * 4096 + 8 * 4096);
}

// The engine's schedule of one expert layer pass, slot by slot, as two streams: the exchange
// stream sends every slot's rows (x / n each), then each slot's results once they are made; the
// compute stream runs slot j's products (cf / n) once its rows are in, and in backward the weight
// gradients (cf) after every slot's input gradients. The pass ends when both streams have.
double simulated_exposure(double x, double cf, int n, bool backward) {
  double exchange = 0, compute = 0;
  std::vector<double> rows_in(n), made(n);
  for (int j = 0; j < n; ++j) rows_in[j] = exchange += x / n;
  for (int j = 0; j < n; ++j) made[j] = compute = std::max(compute, rows_in[j]) + cf / n;
  if (backward) compute += cf;
  for (int j = 0; j < n; ++j) exchange = std::max(exchange, made[j]) + x / n;
  return std::max(exchange, compute) - (backward ? 2 : 1) * cf;
}

// The planner's closed form against the schedule played out, over links from far faster to far
// slower than the products and 1 to 8 slots.
TEST(MoeShape, ExposedExchangeIsWhatTheSlotScheduleLeaves) {
  for (int n : {1, 2, 3, 4, 8}) {
    for (double x : {0.01, 0.3, 1.0, 1.7, 5.0, 40.0}) {
      for (bool backward : {false, true}) {
        const double cf = 1.0, want = simulated_exposure(x, cf, n, backward);
        EXPECT_NEAR(moe_exposed_exchange(x, cf, n, backward), want, 1e-12) << "n " << n << ", x " << x << ", backward " << backward;
        EXPECT_GE(want, 0.0);
      }
    }
  }
}

TEST(MoeShape, AllToAllTimeIsWhatTheExpertProductsLeaveOfItsBytesOverTheLink) {
  const GptShape m = mixtral_8x7b();
  Cluster c;
  Layout l;
  l.dp = 64, l.micro_batch = 1, l.micro_batches = 4, l.stage = 3;
  const double h = 4096, tokens = 4096;  // one sequence per micro-batch
  // One expert's forward products for the micro-batch's top_k b s rows: 2 x 3 h x 14336 FLOPs a row.
  const double cf = tokens * 2 * 2 * (3 * h * 14336) / c.achieved_flops();
  for (uint64_t ep : {1u, 2u, 8u, 16u}) {
    l.ep = ep;
    const StepCost k = step_cost(m, l, layout_memory(m, l), c);
    // Each exchange: top_k b s rows of h in f32 (as models/decoder sends them), (ep - 1) / ep leaving
    // the rank; 8 GPUs share a node, so ep 16 goes over the network's share per GPU.
    const double bw = ep <= 8 ? c.intra_node_bw : c.inter_node_bw / 8;
    const double x = 4 * tokens * 2 * h * (ep - 1) / ep / bw;
    // 8 / ep experts a rank (at least one), 4 micro-batches x 32 layers, a forward and a backward.
    const int slots = std::max(8 / static_cast<int>(ep), 1);
    const double expected = ep == 1 ? 0 : 4 * 32 * (simulated_exposure(x, cf, slots, false) + simulated_exposure(x, cf, slots, true));
    EXPECT_NEAR(k.experts, expected, 1e-12 + 1e-9 * expected) << "ep " << ep;
    // Model FLOPs count the experts a token meets, not all of them.
    const double active = 32 * static_cast<double>(m.moe_layer_active_matmul());
    EXPECT_NEAR(k.model_flops, 64 * 4 * tokens * (6 * active + 12 * 32 * 4096 * h + 6 * 32000 * h), 1e-9 * k.model_flops);
  }
  // The products (cf is 30 x at ep 8) hide all but the first slot's rows in and, forward, the last
  // one's results out: with one expert a rank, 2 x forward and 1 x backward.
  l.ep = 8;
  const double x = 4 * tokens * 2 * h * 7 / 8 / c.intra_node_bw;
  EXPECT_NEAR(step_cost(m, l, layout_memory(m, l), c).experts, 4 * 32 * (2 * x + x), 1e-9);
  // Full recomputation redoes the experts' forward, both exchanges.
  l.checkpointing = Checkpointing::full;
  EXPECT_NEAR(step_cost(m, l, layout_memory(m, l), c).experts, 4 * 32 * (2 * 2 * x + x), 1e-9);
  // A link slow enough that the exchanges outlast the products: the four in turn, less what the
  // products cover (the forward's cf and the backward's 2 cf), with 4 slots at ep 2.
  Cluster slow = c;
  slow.intra_node_bw = 1e9;
  l.checkpointing = Checkpointing::none, l.ep = 2;
  const double xs = 4 * tokens * 2 * h / 2 / slow.intra_node_bw;
  EXPECT_GT(xs, 2 * cf);
  EXPECT_NEAR(step_cost(m, l, layout_memory(m, l), slow).experts, 4 * 32 * ((2 * xs - cf) + (2 * xs - 2 * cf)), 1e-9);
}

TEST(MoeShape, SearchSplitsTheExpertsWhereOnlyThatFits) {
  Cluster c;  // 2 nodes of 8 x 80 GB
  c.nodes = 2;
  PlanSearch search;
  search.global_batch = 64, search.offload = false, search.stage = 2, search.top = 1000;
  const GptShape m = mixtral_8x7b();
  // ZeRO-2 keeps 2 bytes of every parameter a rank holds, 93 GB for all of Mixtral, and 14 more over
  // the ranks sharing them: without tensor or pipeline parallelism each rank may hold only some of
  // the experts (a quarter: 2 P + 14 P / 4 of 11.3B is 62 GB).
  const PlanResult r = search_plans(m, c, search);
  size_t data_parallel_only = 0;
  for (const auto& cand : r.best) {
    if (cand.layout.tp > 1 || cand.layout.pp > 1) continue;
    ++data_parallel_only;
    EXPECT_GE(cand.layout.ep, 4u) << cand.layout.describe();
    EXPECT_EQ(8 % cand.layout.ep, 0u) << cand.layout.describe();
    EXPECT_EQ(cand.layout.dp % cand.layout.ep, 0u) << cand.layout.describe();
    EXPECT_LE(cand.memory.device, 80 * GiB);
  }
  EXPECT_GT(data_parallel_only, 0u);
  GptShape dense = m;
  dense.experts = 0;
  for (const auto& cand : search_plans(dense, c, search).best) EXPECT_EQ(cand.layout.ep, 1u) << cand.layout.describe();
  GptShape bad = m;
  bad.top_k = 9;
  EXPECT_THROW(search_plans(bad, c, search), InvalidArgument);
}

}  // namespace
}  // namespace zeroth
