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

#include <array>    // std::array
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

// The modules of layer l that the config's target_modules name, in the block's order
// (ConfigError for a name the architecture lacks, or an expert layer's MLP).
std::vector<LoraTarget> lora_targets(const GptConfig& c, int layer);
// The adapter block of layer l ("h.<l>.lora" / "layers.<l>.lora"): per target, lora_A.weight
// [r, in] (PEFT's default: Kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in))) and
// lora_B.weight [out, r] (zeros), named "<module>.lora_A.weight".
BlockSpec lora_spec(const GptConfig& c, int layer);
std::string lora_block_name(const GptConfig& c, int layer);
// The tensor-parallel cut of an adapter's parameter (name "<module>.lora_A.weight"), or false
// when `p` is not one.
bool lora_cut(const GptConfig& c, ParamSpec& p, int rank, int ranks);

// One adapter as a pass uses it: this rank's A [r, in] and B [out, r] in f32, where their
// gradients are added, and the columns [col, col + out) of its product's output rows.
struct LoraModule {
  LoraProduct product = LoraProduct::qkv;
  int in = 0, out = 0, col = 0;
  const float *A = nullptr, *B = nullptr;
  float *dA = nullptr, *dB = nullptr;
};
// A layer's adapters and the scratch their passes share (device memory, f32): h and dh [BT, r],
// t [BT, widest out], stage [BT, widest product], dx [BT, widest in].
struct LayerLora {
  std::vector<LoraModule> modules;
  int r = 0;
  float scale = 1;
  float *h = nullptr, *dh = nullptr, *t = nullptr, *stage = nullptr, *dx = nullptr;
};
// Floats of that scratch for BT rows (h, dh, t, stage, dx, sized by the widest adapter), and their
// sum; place_lora_scratch points a layer's at `at`.
std::array<size_t, 5> lora_scratch_parts(const GptConfig& c, const Dims& d, size_t BT);
size_t lora_scratch_floats(const GptConfig& c, const Dims& d, size_t BT);
void place_lora_scratch(LayerLora& lora, const std::array<size_t, 5>& parts, float* at);
// Module `m` of a layer's adapters laid out at `values` (the adapter block's parameters end to end,
// as its spec lists them) with gradients at `grads`, for this rank's widths.
LayerLora layer_lora(const GptConfig& c, const Dims& d, int layer, const std::vector<ParamSpec>& params, const float* values,
                     float* grads);

// In stream work: Y [BT, ld] += scale B (A X) for the adapters of `product` (X [BT, in]); and
// their backward from dY [BT, ld]: the gradients of A and B added, X's gradient added into dX.
// A null `lora` does nothing.
void lora_forward(Kernels& k, const LayerLora* lora, LoraProduct product, const float* X, float* Y, size_t BT, int ld);
void lora_backward(Kernels& k, const LayerLora* lora, LoraProduct product, const float* X, const float* dY, float* dX, size_t BT,
                   int ld);

}  // namespace zeroth::gpt
