// What a rank holds of the model: its part's blocks and its widths (heads, MLP, vocabulary rows,
// experts) under tensor, sequence and expert parallelism. Internal to models/decoder and models/moe.
#pragma once

#include <algorithm>  // std::min
#include <cstddef>    // size_t
#include <vector>     // std::vector

#include "models/decoder/gpt.h"  // GptConfig, GptPart
#include "models/moe/router.h"   // gpt::MoeGate

namespace zeroth::gpt {

// The part, or the whole model (keeping the part's tensor-parallel place) when it names no chunk.
GptPart complete_part(const GptPart& part, const GptConfig& config);
// The part's block ids: the embedding (or the head's copy), each layer's (-1 elsewhere), ln_f.
struct PartBlocks {
  int embed = -1, ln_f = -1, head = -1;  // head: the embedding's block when tied
  std::vector<int> layers;
  std::vector<int> experts;      // each expert layer's experts (right after its layer), -1 elsewhere
  std::vector<int> lora;         // each layer's LoRA adapters (after its layer and experts), -1 elsewhere
  std::vector<int> expert_lora;  // each expert layer's experts' adapters (after the layer's), -1 elsewhere
};
PartBlocks part_blocks(const GptConfig& config, const GptPart& part);
// ConfigError / InvalidArgument when the part does not fit the model: its chunks, its place in each
// parallel group, the heads and experts those groups split (gpt_part.cc).
void check_part(const GptConfig& config, const GptPart& part);

// A rank's widths: C channels in the residual stream, its query heads (NH) and key/value heads (KVH)
// of hs channels, the attention's output width (Cq = NH hs) and its qkv rows' (W = (NH + 2 KVH) hs),
// its MLP width (F), its vocabulary rows [v_lo, v_lo + V); and the architecture's switches.
struct Dims {
  int C = 0, NH = 0, KVH = 0, hs = 0, Cq = 0, W = 0, F = 0, v_lo = 0, V = 0;
  int tp = 1, tp_rank = 0;
  // Expert layers: the gate, each expert's MLP width (X), and the capacities' factors; expert
  // parallelism: this rank's place in the group of `ep` ranks that share the experts out (rank p
  // holds experts [p n, (p + 1) n), n = local_experts()).
  MoeGate gate;
  int X = 0, min_capacity = 0;
  double capacity_factor = 1, eval_capacity_factor = 1;
  bool moe = false;
  int ep = 1, ep_rank = 0;
  size_t ep_group_tokens = 0;  // GptPart::ep_group_tokens
  int local_experts() const { return gate.experts / ep; }
  // SwiGLU experts' up-projection width.
  int expert_up() const { return llama ? 2 * X : X; }
  // The most rows this rank dispatches for BT tokens of its own (every choice, or the experts'
  // capacities at the larger of the two factors), and the most its experts can receive from the
  // group (each rank's rows for them, the worst case being all of them).
  size_t moe_rows(size_t BT) const;
  size_t moe_expert_rows(size_t BT) const;
  // Floats only the all-to-alls need (expert parallelism): the rows on their way out, the experts'
  // outputs on their way back, the gradients at the received rows and at the experts' inputs.
  size_t moe_exchange_floats(size_t BT) const {
    return moe && ep > 1 ? (moe_rows(BT) + 3 * moe_expert_rows(BT)) * static_cast<size_t>(C) : 0;
  }
  int loss_rows = 0;  // GptConfig::loss_chunk_rows
  int mlp_tile = 0;   // GptConfig::mlp_tile_rows
  // Rows per tile of the dense MLP for BT tokens, or 0 where it runs whole: untiled, a tile as large
  // as the micro-batch, or expert layers (whose MLP buffers hold the experts' received rows).
  size_t mlp_tile_rows(size_t BT) const { return mlp_tile > 0 && !moe && static_cast<size_t>(mlp_tile) < BT ? mlp_tile : 0; }
  // Tokens per chunk of the LM head and loss, and whether the logits are kept whole instead.
  size_t loss_chunk(size_t BT) const { return loss_rows > 0 ? std::min<size_t>(loss_rows, BT) : BT; }
  bool keeps_logits() const { return loss_rows == 0; }
  bool sp = false;  // sequence parallel (with tp > 1)
  // Ulysses (GptPart::sq_ranks): the group's size and this rank's place, and the attention's own
  // heads over every position of the samples: NHa query and KVHa key/value heads of this rank's
  // (its tensor-parallel share's) NH and KVH, Cqa = NHa hs and Wa = (NHa + 2 KVHa) hs wide. Every
  // rank of the group takes NH / sq query heads; the key/value heads split alike where sq divides
  // them, else (fewer than ranks) each takes the one its query heads read, replicated as ALST does.
  int sq = 1, sq_rank = 0;
  int NHa = 0, KVHa = 0, Cqa = 0, Wa = 0;
  // The first key/value head rank j of the group attends with (in the qkv rows' key block).
  int kv_first(int j) const { return KVH % sq == 0 ? j * KVHa : j * NHa / (NH / KVH); }
  // The attention's rows for a micro-batch of BT rows of this rank: every position of its samples.
  size_t attn_rows(size_t BT) const { return BT * sq; }
  // Floats only Ulysses needs for B samples of BT rows: the q, k, v rows before they leave (and
  // their gradient after they are back), the gradient at the attention's output in its heads, and
  // the all-to-alls' send and receive buffers (every destination's heads of every row): one serves
  // both for one sample, where each exchange sends from or receives into the heads' own layout.
  size_t ulysses_floats(size_t B, size_t BT) const {
    return sq > 1 ? BT * W + BT * Cq + (B == 1 ? 1 : 2) * BT * sq * static_cast<size_t>(Wa) : 0;
  }
  // Ring attention (GptPart::cp_ranks): the group's size and this rank's place.
  int cp = 1, cp_rank = 0;
  bool ring() const { return cp > 1; }
  // Floats only the ring needs for B samples of BT rows (RingScratch): two buffers of the rows' keys
  // and values, three of their gradients, and one block's output and log-sum-exp (BT / 2B rows).
  size_t ring_floats(size_t B, size_t BT) const {
    if (cp == 1) return 0;
    const size_t c = BT / (2 * B);
    return 5 * BT * 2 * static_cast<size_t>(KVH) * hs + c * (static_cast<size_t>(Cq) + NH);
  }
  bool llama = false, qkv_bias = false, o_bias = false, qk_norm = false;
  bool probabilities = false;  // GptConfig::attention_probabilities: what the attention keeps per row
  float eps = 1e-5f;
  static Dims of(const GptConfig& config, const GptPart& part);
  // MLP-up's output width: gate and up (SwiGLU), or the GELU's input.
  int up() const { return llama ? 2 * F : F; }
  // Rows of the residual stream this rank holds of a micro-batch of BT tokens.
  size_t rows(size_t BT) const { return sp ? BT / tp : BT; }
  // Where this rank's rows start in a whole [BT, C] buffer.
  size_t row_offset(size_t BT) const { return sp ? tp_rank * rows(BT) * C : 0; }
};

}  // namespace zeroth::gpt
