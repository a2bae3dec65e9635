// The planner's long-window terms against counts worked out by hand for Llama 3 8B at 512K
// positions: Ulysses divides a rank's activations by the group's size and adds the all-to-alls'
// buffers, the tiled MLP drops the MLP's intermediates, host checkpoints leave two working copies
// on the device and the rest in host memory, and the step model charges the exchanges' bytes over
// the node's link. Ring attention alike holds a rank's positions and its buffers, and the step
// model charges the part of each send its step's blocks do not cover. The longest window is the
// last that fits: one granule more does not.
#include <gtest/gtest.h>

#include <cstdint>

#include "models/decoder/gpt.h"
#include "planner/planner.h"

namespace zeroth {
namespace {

GptShape llama_3_8b(uint64_t seq_len) {
  const GptConfig g = GptConfig::preset("llama-3-8b");
  const auto u = [](int v) { return static_cast<uint64_t>(v); };
  return GptShape::llama_shape(u(g.n_layer), u(g.n_embd), u(g.n_head), u(g.kv_heads()), u(g.ffn()), seq_len, u(g.vocab_size),
                               g.tie_word_embeddings);
}

TEST(LongWindow, UlyssesTiledMlpAndHostCheckpointsInTheLayerCount) {
  // s = 524288, b = 1, h = 4096, 32 heads over 8 key/value heads of 128 (kv width 1024), ffn 14336.
  const uint64_t s = 524288, h = 4096, kv = 1024, ffn = 14336, a = 32;
  const GptShape whole = llama_3_8b(s);
  // Korthikanti's Llama layer (16-bit): 12 s h + 4 s kv + 6 s ffn, and each row's log-sum-exp 4 a s.
  const uint64_t layer = 12 * s * h + 4 * s * kv + 6 * s * ffn + 4 * a * s;
  EXPECT_EQ(layer_activation_bytes(whole, 1, 1, false, Checkpointing::none), layer);
  // Tiled: the gate, up and product are a tile's, not kept.
  EXPECT_EQ(layer_activation_bytes(whole, 1, 1, false, Checkpointing::none, false, true), layer - 6 * s * ffn);
  // Ulysses over 8: a rank's s / 8 positions, the attention's output kept in both layouts (2 s h
  // more); with the scores kept, its a / 8 heads over all s.
  GptShape local = whole;
  local.seq_len = s / 8;
  const uint64_t r = s / 8;  // a rank's positions
  const uint64_t local_layer = 12 * r * h + 4 * r * kv + 6 * r * ffn + 4 * a * r;
  EXPECT_EQ(layer_activation_bytes(local, 1, 1, false, Checkpointing::none, false, false, 8), local_layer + 2 * r * h);
  // Kept scores: softmax's output, a Llama's 2 a s^2 b, over the rank's a / 8 heads and all s.
  EXPECT_EQ(layer_activation_bytes(local, 1, 1, false, Checkpointing::none, true, false, 8) -
                layer_activation_bytes(local, 1, 1, false, Checkpointing::selective, true, false, 8),
            2 * (a / 8) * s * s);

  Layout l;
  l.dp = 8, l.stage = 3, l.checkpointing = Checkpointing::full, l.sq = 8;
  const LayoutMemory ulysses = layout_memory(whole, l);
  // Full recomputation keeps each of the 32 layers' inputs (2 r h), recomputes one layer whole, and
  // holds Ulysses' f32 scratch: one exchange buffer (one sample) of the 48 heads' rows sent, the
  // q, k, v rows (48 heads) and the gradient at the attention's output (32 heads), 128 wide; the
  // head keeps the final norm's input (4 r h) and one chunk of logits.
  const uint64_t exchange = 4 * r * 128 * (48 + 48 + 32);
  const uint64_t head = 4 * r * h + 4 * logits_chunk_rows(whole.vocab) * whole.vocab;
  const uint64_t input = 2 * r * h;
  EXPECT_EQ(ulysses.activations, 32 * input + local_layer + 2 * r * h + exchange + head);
  l.tiled_mlp = true, l.host_checkpoints = true;
  const LayoutMemory alst = layout_memory(whole, l);
  // On the host: the 32 layers' inputs. On the device: two working copies, the layer recomputed
  // without its MLP's intermediates.
  EXPECT_EQ(alst.host, 32 * input);
  EXPECT_EQ(alst.activations, 2 * input + local_layer - 6 * r * ffn + 2 * r * h + exchange + head);
}

TEST(LongWindow, TheExchangesBytesCrossTheNodesLink) {
  const GptShape s = llama_3_8b(524288);
  Layout l;
  l.dp = 8, l.stage = 3, l.checkpointing = Checkpointing::full, l.sq = 8;
  Cluster c;
  const StepCost cost = step_cost(s, l, layout_memory(s, l), c);
  // Per layer 3 passes (forward, backward, recomputation) of q, k, v and the output: f32 rows of
  // 4096 + 2 x 1024 and 4096 for the rank's 65536 positions, 7/8 of them leaving it.
  const double bytes = 4.0 * 65536 * (4096 + 2 * 1024 + 4096) * 7 / 8;
  EXPECT_NEAR(cost.sequence, 32 * 3 * bytes / c.intra_node_bw, 1e-9 * cost.sequence);
}

TEST(LongWindow, TheRingHoldsARanksPositionsAndItsBuffers) {
  // Ring attention over 8: a rank's r = s / 8 positions, no second layout (the attention runs on the
  // rank's rows), and the ring's f32 buffers (Dims::ring_floats): five of the rank's keys and
  // values (2 x 1024 wide), one block's output (4096 wide) and log-sum-exp (32 heads) of r / 2 rows.
  const uint64_t s = 524288, h = 4096, kv = 1024, ffn = 14336, a = 32, r = s / 8;
  const GptShape whole = llama_3_8b(s);
  const uint64_t local_layer = 12 * r * h + 4 * r * kv + 6 * r * ffn + 4 * a * r;
  Layout l;
  l.dp = 8, l.stage = 3, l.checkpointing = Checkpointing::full, l.cp = 8;
  const uint64_t ring = 4 * (5 * r * 2 * kv + r / 2 * (h + a));
  const uint64_t head = 4 * r * h + 4 * logits_chunk_rows(whole.vocab) * whole.vocab;
  EXPECT_EQ(layout_memory(whole, l).activations, 32 * 2 * r * h + local_layer + ring + head);
  EXPECT_EQ(l.sample_groups(), 1u);
}

TEST(LongWindow, TheRingsSendsCostOnlyWhatTheBlocksDoNotCover) {
  const GptShape s = llama_3_8b(524288);
  Layout l;
  l.dp = 8, l.stage = 3, l.checkpointing = Checkpointing::full, l.cp = 8;
  Cluster c;
  // A rank's 65536 positions' keys and values, f32 and 2 x 1024 wide, over NVLink; each step's
  // blocks two whole ones of 32768 x 32768 positions, 4 x 4096 FLOPs a pair.
  const double send = 4.0 * 65536 * 2 * 1024 / c.intra_node_bw;
  const double step = 2.0 * 32768 * 32768 * 4 * 4096 / c.achieved_flops();
  ASSERT_LT(send, step);  // at 512K the blocks hide the sends: what is left is backward's last gradient
  EXPECT_NEAR(step_cost(s, l, layout_memory(s, l), c).sequence, 32 * send, 1e-9 * 32 * send);
  // Over a slow link (1 GB/s) a short window's blocks do not: the rest of each send is exposed, 7
  // forward (and 7 in the recomputation) and 7 of twice the bytes backward.
  Cluster slow;
  slow.intra_node_bw = 1e9;
  const GptShape short_window = llama_3_8b(8192);
  const double send_short = 4.0 * 1024 * 2 * 1024 / slow.intra_node_bw;
  const double step_short = 2.0 * 512 * 512 * 4 * 4096 / slow.achieved_flops();
  ASSERT_GT(send_short, step_short);
  const double want = 32 * (2 * 7 * (send_short - step_short) + 7 * 2 * (send_short - step_short) + send_short);
  EXPECT_NEAR(step_cost(short_window, l, layout_memory(short_window, l), slow).sequence, want, 1e-9 * want);
}

TEST(LongWindow, TheLongestWindowFitsAndOneGranuleMoreDoesNot) {
  const GptShape s = llama_3_8b(4096);
  Cluster c;
  PlanSearch search;
  search.global_batch = 1, search.sequence = true;
  const WindowResult w = longest_window(s, c, search, 8192, GptConfig::kMaxSeqLen);
  ASSERT_GT(w.seq_len, 0u);
  EXPECT_GT(w.plans.fitting, 0u);
  GptShape more = s;
  more.seq_len = w.seq_len + 8192;
  EXPECT_EQ(search_plans(more, c, search).fitting, 0u);
  // Ulysses, the tiled MLP or host checkpoints make it: without them the window is shorter.
  PlanSearch plain = search;
  plain.sequence = false;
  EXPECT_LT(longest_window(s, c, plain, 8192, GptConfig::kMaxSeqLen).seq_len, w.seq_len);
  // Up to the engine's bound: a limit below the answer is the answer, said to be one.
  const WindowResult capped = longest_window(s, c, search, 8192, 8192 * 8);
  EXPECT_TRUE(capped.capped);
  EXPECT_EQ(capped.seq_len, 8192u * 8);
  EXPECT_FALSE(w.capped);
}

}  // namespace
}  // namespace zeroth
