// LoRA adapters of a transformer block (GptConfig::lora): which linear layers a config targets,
// the adapter block's parameters as PEFT names them, and the adapters' share of a layer's passes.
// Internal to models/decoder.
//
// A layer's adapters live in a block of their own ("<layer>.lora"), used right before the layer
// in forward and right after it in backward: its forward use copies A and B to f32 memory the
// layer's passes read, its backward use adds the gradients the layer's backward left in an f32
// scratch. Each adapter adds scale B (A x) to its product's output, in the columns its module
// holds there (q, k and v share one product in the Llama family; gate and up another). Under
// tensor parallelism A and B split as their base layer: a column-parallel layer's B by rows (A
// whole, its gradient a partial sum over the group), a row-parallel layer's A by columns (B whole:
// B (A_r x_r) is this rank's share of the partial sum the layer reduces anyway, and B's gradient a
// partial sum).
#pragma once

#include <cstddef>  // size_t
#include <string>   // std::string
#include <vector>   // std::vector

#include "models/block_api.h"        // BlockSpec, ParamSpec
#include "models/decoder/dims.h"     // Dims
#include "models/decoder/gpt.h"      // GptConfig
#include "models/kernels/kernels.h"  // Kernels

namespace zeroth::gpt {

// The four products of a transformer block an adapter can join.
enum class LoraProduct : uint8_t { qkv, attn_out, mlp_up, mlp_down };

// A targeted linear layer: its path inside the layer ("self_attn.q_proj", "attn.c_attn"), its
// product, its full shape, and how tensor parallelism splits its weight (axis 0 in `groups`
// segments: column-parallel; axis 1: row-parallel).
struct LoraTarget {
  std::string module;
  LoraProduct product = LoraProduct::qkv;
  int64_t in = 0, out = 0;
  int axis = 0, groups = 1;
};

// The modules of layer l that the config's target_modules name, in the block's order (an expert
// layer's MLP is its experts': expert_lora_targets); ConfigError for a name the architecture lacks.
std::vector<LoraTarget> lora_targets(const GptConfig& c, int layer);
// The linear layers of an expert the config targets, `module` named under the expert's path: the
// Llama family's w1 (gate) and w3 (up), one product (w1's columns, then w3's), and w2 (down), or
// with per-head q/k norms (Qwen3-MoE) gate_proj, up_proj and down_proj; GPT-2's c_fc and c_proj.
// Empty when the model has no expert layer or the config targets none of these.
std::vector<LoraTarget> expert_lora_targets(const GptConfig& c);
// The adapters of expert layer l's experts that `part` holds ("<layer>.experts.lora", shared out
// over the expert-parallel ranks as the experts are, and whole on every tensor-parallel rank): per
// expert, its targets laid out as lora_spec lays a layer's, named under the expert's path as the
// experts' block names it ("block_sparse_moe.experts.3.w1.lora_A.weight").
BlockSpec expert_lora_spec(const GptConfig& c, int layer, int ep_rank, int ep_ranks);
// The adapter block of layer l ("h.<l>.lora" / "layers.<l>.lora"): per target, lora_A.weight
// [r, in] (PEFT's default: Kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in))) and
// lora_B.weight [out, r] (zeros), named "<module>.lora_A.weight".
BlockSpec lora_spec(const GptConfig& c, int layer);
std::string lora_block_name(const GptConfig& c, int layer);
// The tensor-parallel cut of an adapter's parameter (name "<module>.lora_A.weight"), or false
// when `p` is not one.
bool lora_cut(const GptConfig& c, ParamSpec& p, int rank, int ranks);

// A product's adapters as a pass uses them (this rank's slices, f32): the modules' A stacked
// ([rows = modules x r, in]: they share the product's input, so h = X A^T is one product for all of
// them), where their gradient is added, and each module's B [out, r] with its gradient, its columns
// [col, col + out) of the product's output and [hcol, hcol + r) of h.
struct LoraModule {
  int out = 0, col = 0, hcol = 0;
  const float* B = nullptr;
  float* dB = nullptr;
};
struct LoraProductSet {
  LoraProduct product = LoraProduct::qkv;
  int in = 0, rows = 0;
  size_t h_at = 0;  // where its h [BT, rows] starts in the layer's LayerActs::lora_h, per row of BT
  const float* A = nullptr;
  float* dA = nullptr;
  std::vector<LoraModule> modules;
};
// A layer's adapters: its products', the adapter block's parameters' sizes in order (as they lie
// end to end in the values and gradients), the scale, and the scratch dh [BT, widest rows].
struct LayerLora {
  std::vector<LoraProductSet> products;
  std::vector<size_t> sizes;
  int r = 0;
  float scale = 1;
  float* dh = nullptr;
  size_t floats() const;
};
// Floats of a layer's kept h (LayerActs::lora_h) and of the passes' shared scratch, for BT rows;
// of an expert layer's (LayerActs::moe_lora_h) and the experts' scratch, for the `rows` its experts
// receive (Dims::moe_expert_rows).
size_t lora_h_floats(const GptConfig& c, size_t BT);
size_t lora_scratch_floats(const GptConfig& c, size_t BT);
size_t expert_lora_h_floats(const GptConfig& c, size_t rows);
size_t expert_lora_scratch_floats(const GptConfig& c, size_t rows);
// A layer's adapters laid out at `values` (the adapter block's parameters end to end, as its spec
// lists them) with gradients at `grads`, for this rank's widths; dh at `scratch`.
LayerLora layer_lora(const GptConfig& c, const Dims& d, int layer, const std::vector<ParamSpec>& params, const float* values,
                     float* grads, float* scratch);
// Each local expert's adapters, from its layer's expert adapter block (expert_lora_spec) laid out
// at `values` with gradients at `grads`; their h regions are of the layer's received rows.
std::vector<LayerLora> experts_lora(const GptConfig& c, const Dims& d, const std::vector<ParamSpec>& params, const float* values,
                                    float* grads, float* scratch);

// In stream work: Y [BT, ld] += scale B (A X) for the adapters of `product` (X [BT, in]), keeping
// A X in the layer's h (LayerActs::lora_h); and their backward from dY [BT, ld] and that h: the
// gradients of A and B added, X's gradient added into dX. A null `lora` does nothing. An expert's
// rows are rows [row0, row0 + BT) of h's regions of `h_rows` rows (0: BT, a layer's own).
void lora_forward(Kernels& k, const LayerLora* lora, LoraProduct product, const float* X, float* Y, size_t BT, int ld, float* h,
                  size_t h_rows = 0, size_t row0 = 0);
void lora_backward(Kernels& k, const LayerLora* lora, LoraProduct product, const float* X, const float* dY, float* dX, size_t BT,
                   int ld, const float* h, size_t h_rows = 0, size_t row0 = 0);

}  // namespace zeroth::gpt
