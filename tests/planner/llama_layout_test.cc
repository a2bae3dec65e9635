// The planner's Llama shapes against their published parameter counts (each preset's model as
// models/decoder builds it) and against the activation count worked out by hand for Llama 3 70B; the
// search on 512 GPUs keeps tensor parallelism to divisors of the key/value heads, and the layout
// NVIDIA publishes for Llama 3 70B on 512 H100s (Megatron-Bridge's benchmark recipe: tp 4, pp 4,
// distributed optimizer) fits 80 GB by the planner's memory model.
#include <gtest/gtest.h>

#include <cstdint>

#include "models/decoder/gpt.h"
#include "planner/planner.h"

namespace zeroth {
namespace {

constexpr uint64_t GiB = 1ull << 30;

GptShape shape_of(const char* preset, uint64_t seq_len) {
  const GptConfig g = GptConfig::preset(preset);
  const auto u = [](int v) { return static_cast<uint64_t>(v); };
  GptShape s = GptShape::llama_shape(u(g.n_layer), u(g.n_embd), u(g.n_head), u(g.kv_heads()), u(g.ffn()), seq_len, u(g.vocab_size),
                                     g.tie_word_embeddings);
  s.qkv_bias = g.qkv_bias;
  return s;
}

TEST(LlamaShape, CountsTheParametersTheModelHas) {
  for (const char* preset :
       {"smollm-135m", "smollm-360m", "qwen2.5-0.5b", "llama-3.2-1b", "tinyllama-1.1b", "llama-2-7b", "llama-3-8b", "llama-3-70b"}) {
    EXPECT_EQ(shape_of(preset, 2048).params(), GptConfig::preset(preset).num_parameters()) << preset;
  }
  EXPECT_EQ(shape_of("llama-3-8b", 8192).params(), 8'030'261'248u);  // Meta's model card: 8.03B
  EXPECT_EQ(shape_of("llama-3-70b", 8192).params(), 70'553'706'496u);
  // Tied (SmolLM): the head is the embedding, counted once.
  const GptShape smol = shape_of("smollm-135m", 2048);
  GptShape untied = smol;
  untied.tied = false;
  EXPECT_EQ(untied.params() - smol.params(), smol.vocab * smol.hidden);
}

TEST(LlamaShape, ActivationsOfLlama3_70B) {
  // s = 8192, b = 1, h = 8192, a = 64, key/value width 8 x 128 = 1024, SwiGLU 28672:
  // what tensor parallelism splits, 4 s b h + 4 s b kv + 6 s b ffn = 1,711,276,032; what it leaves
  // whole, both norms' inputs and outputs, 8 s b h = 536,870,912; softmax's output 2 a s^2 b =
  // 8,589,934,592 where attention keeps it (blocked attention: 4 a s b = 2,097,152 of log-sum-exp).
  const GptShape s = shape_of("llama-3-70b", 8192);
  EXPECT_EQ(layer_activation_bytes(s, 1, 1, false, Checkpointing::none, true), 10'838'081'536u);
  EXPECT_EQ(layer_activation_bytes(s, 1, 8, false, Checkpointing::none, true), 536'870'912u + 1'711'276'032u / 8 + 8'589'934'592u / 8);
  EXPECT_EQ(layer_activation_bytes(s, 1, 8, true, Checkpointing::none, true), (536'870'912u + 1'711'276'032u + 8'589'934'592u) / 8);
  EXPECT_EQ(layer_activation_bytes(s, 1, 8, true, Checkpointing::selective, true), (536'870'912u + 1'711'276'032u) / 8);
  EXPECT_EQ(layer_activation_bytes(s, 1, 8, false, Checkpointing::full, true), 2u * 8192 * 8192);
  EXPECT_EQ(layer_activation_bytes(s, 1, 1, false, Checkpointing::none), 536'870'912u + 1'711'276'032u + 2'097'152u);
}

TEST(LlamaShape, TensorParallelSlicesAndTheUntiedHead) {
  const GptShape s = shape_of("llama-3-70b", 8192);
  // q, o: h x h; k, v: h x 1024; gate, up, down: h x 28672; split 8 ways, the two norms whole.
  const uint64_t matmul = 2ull * 8192 * 8192 + 2ull * 8192 * 1024 + 3ull * 8192 * 28672;
  EXPECT_EQ(s.layer_matmul_params(), matmul);
  EXPECT_EQ(s.layer_slice(8), matmul / 8 + 2 * 8192);
  // One stage holds the embedding and, untied, the head beside it, and the final norm.
  Layout l;
  l.tp = 8;
  EXPECT_EQ(layout_memory(s, l).stage_params, 80 * s.layer_slice(8) + 2 * (128256 / 8) * 8192 + 8192);
  // Two stages: the head's slice on the last, the embedding's on the first.
  l.pp = 2, l.micro_batches = 8;
  EXPECT_EQ(layout_memory(s, l).stage_params, 40 * s.layer_slice(8) + (128256 / 8) * 8192);
}

TEST(LlamaShape, StepFlopsCountTheSwiGluAndTheNarrowKeysAndValues) {
  const GptShape s = shape_of("llama-3-70b", 8192);
  Layout l;
  l.dp = 64, l.tp = 8, l.micro_batches = 2, l.checkpointing = Checkpointing::selective, l.sequence_parallel = true;
  const StepCost k = step_cost(s, l, layout_memory(s, l), Cluster{});
  // 6 (matmul weights) + 12 l s h per token, and the head's 6 V h.
  const double per_token = 6.0 * 80 * static_cast<double>(s.layer_matmul_params()) + 12.0 * 80 * 8192 * 8192 + 6.0 * 128256 * 8192;
  EXPECT_NEAR(k.model_flops, 64 * 2 * 8192 * per_token, 1e-9 * k.model_flops);
  EXPECT_NEAR(per_token, 4.81e11, 0.01e11);  // about 6 x 70.6B + attention: 8192 tokens of context
}

TEST(LlamaShape, PlansForLlama3_70BOn512Gpus) {
  // 16 GPUs a node, so that tp 16 divides the node and the 64 query heads: only the 8 key/value
  // heads rule it out.
  Cluster c;
  c.gpus_per_node = 16, c.nodes = 32;
  PlanSearch search;
  search.global_batch = 1024;  // Megatron-Bridge's 512-GPU benchmark batch: 1024 sequences of 8192
  const GptShape s = shape_of("llama-3-70b", 8192);
  const PlanResult r = search_plans(s, c, search);
  ASSERT_FALSE(r.best.empty());
  for (const auto& cand : r.best) {
    EXPECT_EQ(8 % cand.layout.tp, 0u) << cand.layout.describe();
    EXPECT_LE(cand.memory.device, 80 * GiB) << cand.layout.describe();
  }
  EXPECT_GT(r.best.front().cost.mfu, 0.3);
  EXPECT_LT(r.best.front().cost.mfu, 0.6);
  // The published layout that ran (tp 4, pp 4, context parallelism 2 over dp 16, the distributed
  // optimizer, no recomputation with flash attention's memory): without context parallelism, as
  // dp 32 here, with selective recomputation standing for flash attention, it fits 80 GB too.
  Layout nvidia;
  nvidia.dp = 32, nvidia.tp = 4, nvidia.pp = 4, nvidia.micro_batches = 32, nvidia.stage = 1, nvidia.sequence_parallel = true;
  nvidia.checkpointing = Checkpointing::selective;
  const LayoutMemory m = layout_memory(s, nvidia);
  EXPECT_LT(m.device, 80 * GiB);
  EXPECT_GT(m.device, 40 * GiB);
  // A model with 2 key/value heads never gets tensor parallelism of 4 or 8.
  GptShape two = s;
  two.kv_heads = 2;
  for (const auto& cand : search_plans(two, c, search).best) EXPECT_LE(cand.layout.tp, 2u) << cand.layout.describe();
}

}  // namespace
}  // namespace zeroth
