// The Llama family's transformer block around the tensor-parallel group's collectives, as Hugging
// Face's LlamaDecoderLayer computes it: x + o(attention(rope(qk_norm(q, k)), v)) over RMSNorm(x),
// then + down(silu(gate) * up) over RMSNorm of that. The same split as GPT-2's (layers.h): q/k/v
// and gate/up column-parallel (a rank's query heads with its key/value heads), o and down
// row-parallel.
#include "models/decoder/layers.h"

namespace zeroth::gpt {
namespace {

// Parameter indices inside a Llama-family block, in the order block_specs declares them: the q/k/v
// weights (and biases) and gate/up are fused runs, used through their first parameter.
struct LlamaParams {
  int ln1 = 0, qkv = 0, qkv_b = -1, q_norm = -1, k_norm = -1, o = 0, o_b = -1, ln2 = 0, gate = 0, down = 0;
  explicit LlamaParams(const Dims& d) {
    int i = 0;
    ln1 = i++;
    qkv = i, i += 3;
    if (d.qkv_bias) qkv_b = i, i += 3;
    if (d.qk_norm) q_norm = i++, k_norm = i++;
    o = i++;
    if (d.o_bias) o_b = i++;
    ln2 = i++;
    gate = i, i += 2;
    down = i++;
  }
};


}  // namespace

void llama_layer_forward(Kernels& k, const TensorGroup& g, BoundRef w, const LayerActs& a, const Scratch& s, const float* x,
                         float* out, int B, int T, KvCache kv, const MoePass& moe, const LayerLora* lora) {
  const Dims d = g.dims();
  const LlamaParams ix(d);
  const size_t BT = static_cast<size_t>(B) * T, R = d.rows(BT);
  // Row-parallel outputs are partial sums: the bias joins on rank 0 only, so the sum holds it once.
  const bool bias = d.tp_rank == 0;
  float* proj = d.sp ? s.partial : a.res2;
  k.submit([&k, w, a, x, d, R, ix] { k.rmsnorm_forward(a.ln1, a.ln1_rstd, x, (*w)->p(ix.ln1), R, 1, d.C, d.C, d.eps); });
  const float* ln1 = g.gathered_rows(a.ln1, s.ln_whole, BT);
  k.submit([&k, w, a, s, d, B, T, BT, proj, bias, ln1, ix, kv, lora] {
    const Bound& p = **w;
    k.matmul_forward(a.qkv, ln1, p.p(ix.qkv), param(p, ix.qkv_b), BT, d.C, d.W);
    lora_forward(k, lora, LoraProduct::qkv, ln1, a.qkv, BT, d.W, a.lora_h);
    if (d.qk_norm) {
      // The norms read the projections' q and k, kept for backward, and write the rows in place.
      k.copy(a.qk_pre, a.qkv, BT * d.W);
      k.rmsnorm_forward(a.qkv, a.qk_rstd, a.qk_pre, p.p(ix.q_norm), BT, d.NH, d.hs, d.W, d.eps);
      const size_t at = static_cast<size_t>(d.NH) * d.hs;
      k.rmsnorm_forward(a.qkv + at, a.qk_rstd + BT * d.NH, a.qk_pre + at, p.p(ix.k_norm), BT, d.KVH, d.hs, d.W, d.eps);
    }
    // Positions start at the cache's (0 without one): the table's rows from there.
    rope_rows(k, kv.spans, a.qkv, s.rope + static_cast<size_t>(kv.pos) * d.hs, BT, T, d.W, d.NH + d.KVH, d.hs, false);
    attend(k, a, kv, B, T, d.NH, d.KVH, d.hs, p.attention_products());
    k.matmul_forward(proj, a.atty, p.p(ix.o), bias ? param(p, ix.o_b) : nullptr, BT, d.Cq, d.C);
    lora_forward(k, lora, LoraProduct::attn_out, a.atty, proj, BT, d.C, a.lora_h);
  });
  g.reduce(proj, a.res2, BT);
  k.submit([&k, w, a, x, d, R, ix] {
    k.accumulate(a.res2, x, R * d.C);
    k.rmsnorm_forward(a.ln2, a.ln2_rstd, a.res2, (*w)->p(ix.ln2), R, 1, d.C, d.C, d.eps);
  });
  const float* ln2 = g.gathered_rows(a.ln2, s.ln_whole, BT);
  float* down = out == nullptr ? nullptr : d.sp ? s.partial : out;
  if (moe.expert_layer) {
    // The router ends this block's use; the experts' block adds the MLP's output (moe_experts_forward).
    // A recomputation keeps the forward's routing.
    if (out != nullptr) moe_router_forward(k, w, ix.gate, d, s, ln2, BT, moe);
    return;
  } else {
    const MlpIx mlp{ix.gate, -1, ix.down, -1, -1};
    k.submit([&k, w, a, s, d, BT, down, ln2, mlp, lora] { mlp_forward(k, **w, mlp, d, a, s, ln2, down, BT, lora); });
  }
  if (out == nullptr) return;
  g.reduce(down, out, BT);
  k.submit([&k, a, out, d, R] { k.accumulate(out, a.res2, R * d.C); });
}

void llama_layer_backward(Kernels& k, const TensorGroup& g, BoundRef w, const LayerActs& a, const Scratch& s, const float* x, int B,
                          int T, const MoePass& moe, const Spans& spans, const LayerLora* lora) {
  const Dims d = g.dims();
  const LlamaParams ix(d);
  const size_t BT = static_cast<size_t>(B) * T, R = d.rows(BT);
  float* partial = d.sp ? s.partial : s.dC;
  const float* dout = g.gathered_rows(s.dresid, s.gathered, BT);
  const float* ln2 = g.gathered_rows(a.ln2, s.ln_whole, BT);
  if (moe.expert_layer) {
    moe_router_backward(k, w, ix.gate, d, a, s, ln2, partial, BT, moe);
    g.keep_rows(partial, s.dC, BT);  // every rank's is whole (the experts are replicated over the group)
  } else {
    const MlpIx mlp{ix.gate, -1, ix.down, -1, -1};
    k.submit(
        [&k, w, a, s, d, BT, dout, partial, ln2, mlp, lora] { mlp_backward(k, **w, mlp, d, a, s, ln2, dout, partial, BT, lora); });
    g.reduce(partial, s.dC, BT);
  }
  k.submit([&k, w, a, s, d, R, ix] {
    const Bound& p = **w;
    k.rmsnorm_backward(s.dresid, p.g(ix.ln2), s.dC, a.res2, p.p(ix.ln2), a.ln2_rstd, R, 1, d.C, d.C, true);
  });
  dout = g.gathered_rows(s.dresid, s.gathered, BT);
  const float* ln1 = g.gathered_rows(a.ln1, s.ln_whole, BT);
  k.submit([&k, w, a, s, d, B, T, BT, dout, partial, ln1, ix, spans, lora] {
    const Bound& p = **w;
    k.matmul_backward(s.dC, p.g(ix.o), grad(p, ix.o_b), dout, a.atty, p.p(ix.o), BT, d.Cq, d.C);
    lora_backward(k, lora, LoraProduct::attn_out, a.atty, dout, s.dC, BT, d.C, a.lora_h);
    attention_backward_rows(k, spans, a, s, B, T, d.NH, d.KVH, d.hs, d.probabilities, p.attention_products());
    // The gradient at the rotated q and k turned back: the gradient at the values before the turn.
    rope_rows(k, spans, s.dqkv, s.rope, BT, T, d.W, d.NH + d.KVH, d.hs, true);
    const float* dproj = s.dqkv;
    if (d.qk_norm) {
      // v's gradient as it is, q's and k's through their norms.
      k.copy(s.dqk, s.dqkv, BT * d.W);
      k.rmsnorm_backward(s.dqk, p.g(ix.q_norm), s.dqkv, a.qk_pre, p.p(ix.q_norm), a.qk_rstd, BT, d.NH, d.hs, d.W, false);
      const size_t at = static_cast<size_t>(d.NH) * d.hs;
      k.rmsnorm_backward(s.dqk + at, p.g(ix.k_norm), s.dqkv + at, a.qk_pre + at, p.p(ix.k_norm), a.qk_rstd + BT * d.NH, BT, d.KVH,
                         d.hs, d.W, false);
      dproj = s.dqk;
    }
    k.matmul_backward(partial, p.g(ix.qkv), grad(p, ix.qkv_b), dproj, ln1, p.p(ix.qkv), BT, d.C, d.W);
    lora_backward(k, lora, LoraProduct::qkv, ln1, dproj, partial, BT, d.W, a.lora_h);
  });
  g.reduce(partial, s.dC, BT);
  k.submit([&k, w, a, s, x, d, R, ix] {
    const Bound& p = **w;
    k.rmsnorm_backward(s.dresid, p.g(ix.ln1), s.dC, x, p.p(ix.ln1), a.ln1_rstd, R, 1, d.C, d.C, true);
  });
}

}  // namespace zeroth::gpt
