// A block's dense MLP in its passes, whole or by tiles of rows (Dims::mlp_tile_rows): up (x W^T + b),
// the activation (GELU, or SwiGLU over gate and up), down. Tiled, no tile's intermediates outlive
// it: the forward makes each tile's in the scratch and keeps nothing, the backward makes them again
// before taking the tile's gradients. Each row's products are the same either way; the weights'
// gradients add the tiles' in turn.
#include "models/decoder/layers.h"

namespace zeroth::gpt {

namespace {

// Rows [r0, r0 + n) of a micro-batch of BT: up and the activation into fch and act (the rows'
// own), and with `out` down into out's rows.
void rows_forward(Kernels& k, const Bound& p, const MlpIx& ix, const Dims& d, const float* x, float* fch, float* act, float* out,
                  size_t r0, size_t n, size_t BT, const LayerLora* lora, float* lora_h) {
  const float* in = x + r0 * d.C;
  k.matmul_forward(fch, in, p.p(static_cast<size_t>(ix.up)), param(p, ix.up_bias), n, d.C, d.up());
  lora_forward(k, lora, LoraProduct::mlp_up, in, fch, n, d.up(), lora_h, BT, r0);
  if (d.llama) k.swiglu_forward(act, fch, n, d.F);
  else k.gelu_forward(act, fch, n * d.F);
  if (out == nullptr) return;
  k.matmul_forward(out + r0 * d.C, act, p.p(static_cast<size_t>(ix.down)), param(p, ix.down_bias), n, d.F, d.C);
  lora_forward(k, lora, LoraProduct::mlp_down, act, out + r0 * d.C, n, d.C, lora_h, BT, r0);
}

// Their backward from dout's rows: the weights' gradients added, dx's rows written; dfch and dact
// (GPT-2's is dfch: its activation runs in place) the rows' scratch.
void rows_backward(Kernels& k, const Bound& p, const MlpIx& ix, const Dims& d, const float* x, const float* fch, const float* act,
                   const float* dout, float* dfch, float* dact, float* dx, size_t r0, size_t n, size_t BT, const LayerLora* lora,
                   const float* lora_h) {
  const float *in = x + r0 * d.C, *dy = dout + r0 * d.C;
  float* da = d.llama ? dact : dfch;
  k.matmul_backward(da, grad(p, ix.down), grad(p, ix.down_bias_grad), dy, act, p.p(static_cast<size_t>(ix.down)), n, d.F, d.C);
  lora_backward(k, lora, LoraProduct::mlp_down, act, dy, da, n, d.C, lora_h, BT, r0);
  if (d.llama) k.swiglu_backward(dfch, fch, dact, n, d.F);
  else k.gelu_backward(dfch, fch, dfch, n * d.F);
  k.matmul_backward(dx + r0 * d.C, grad(p, ix.up), grad(p, ix.up_bias), dfch, in, p.p(static_cast<size_t>(ix.up)), n, d.C, d.up());
  lora_backward(k, lora, LoraProduct::mlp_up, in, dfch, dx + r0 * d.C, n, d.up(), lora_h, BT, r0);
}

}  // namespace

void mlp_forward(Kernels& k, const Bound& p, const MlpIx& ix, const Dims& d, const LayerActs& a, const Scratch& s, const float* x,
                 float* out, size_t BT, const LayerLora* lora) {
  const size_t tile = d.mlp_tile_rows(BT);
  if (tile == 0) return rows_forward(k, p, ix, d, x, a.fch, a.fch_act, out, 0, BT, BT, lora, a.lora_h);
  if (out == nullptr) return;  // a recomputation: the tiles keep nothing for the backward
  for (size_t r0 = 0; r0 < BT; r0 += tile)
    rows_forward(k, p, ix, d, x, s.mlp_fch, s.mlp_act, out, r0, std::min(tile, BT - r0), BT, lora, a.lora_h);
}

void mlp_backward(Kernels& k, const Bound& p, const MlpIx& ix, const Dims& d, const LayerActs& a, const Scratch& s, const float* x,
                  const float* dout, float* dx, size_t BT, const LayerLora* lora) {
  const size_t tile = d.mlp_tile_rows(BT);
  if (tile == 0) return rows_backward(k, p, ix, d, x, a.fch, a.fch_act, dout, s.dfch, s.dact, dx, 0, BT, BT, lora, a.lora_h);
  for (size_t r0 = 0; r0 < BT; r0 += tile) {
    const size_t n = std::min(tile, BT - r0);
    rows_forward(k, p, ix, d, x, s.mlp_fch, s.mlp_act, nullptr, r0, n, BT, lora, a.lora_h);
    rows_backward(k, p, ix, d, x, s.mlp_fch, s.mlp_act, dout, s.dfch, s.dact, dx, r0, n, BT, lora, a.lora_h);
  }
}

}  // namespace zeroth::gpt
