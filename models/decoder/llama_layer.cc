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

void llama_layer_forward(Kernels& k, const TensorGroup& g, const SequenceGroup& q, BoundRef w, const LayerActs& a, const Scratch& s,
                         const float* x, float* out, int B, int T, KvCache kv, const MoePass& moe, const LayerLora* lora) {
  const Dims d = g.dims();
  const LlamaParams ix(d);
  const size_t BT = static_cast<size_t>(B) * T, R = d.rows(BT);
  // Row-parallel outputs are partial sums: the bias joins on rank 0 only, so the sum holds it once.
  const bool bias = d.tp_rank == 0;
  float* proj = d.sp ? s.partial : a.res2;
  k.submit([&k, w, a, x, d, R, ix] { k.rmsnorm_forward(a.ln1, a.ln1_rstd, x, (*w)->p(ix.ln1), R, 1, d.C, d.C, d.eps); });
  const float* ln1 = g.gathered_rows(a.ln1, s.ln_whole, BT);
  float* qkv = q.active() ? s.sq_rows : a.qkv;
  k.submit([&k, w, a, d, BT, ln1, qkv, ix, lora] {
    const Bound& p = **w;
    k.matmul_forward(qkv, ln1, p.p(ix.qkv), param(p, ix.qkv_b), BT, d.C, d.W);
    lora_forward(k, lora, LoraProduct::qkv, ln1, qkv, BT, d.W, a.lora_h);
  });
  if (q.active()) q.qkv_to_heads(qkv, a.qkv, B, T);
  // The attention's rows: with Ulysses every position of the samples, in this rank's heads.
  const int Ta = T * d.sq;
  const size_t BTa = d.attn_rows(BT);
  k.submit([&k, w, a, s, d, B, Ta, BTa, ix, kv] {
    const Bound& p = **w;
    if (d.qk_norm) {
      // The norms read the projections' q and k, kept for backward, and write the rows in place.
      k.copy(a.qk_pre, a.qkv, BTa * d.Wa);
      k.rmsnorm_forward(a.qkv, a.qk_rstd, a.qk_pre, p.p(ix.q_norm), BTa, d.NHa, d.hs, d.Wa, d.eps);
      const size_t at = static_cast<size_t>(d.NHa) * d.hs;
      k.rmsnorm_forward(a.qkv + at, a.qk_rstd + BTa * d.NHa, a.qk_pre + at, p.p(ix.k_norm), BTa, d.KVHa, d.hs, d.Wa, d.eps);
    }
    // Positions start at the cache's (0 without one): the table's rows from there.
    rope_rows(k, kv.spans, a.qkv, s.rope + static_cast<size_t>(kv.pos) * d.hs, BTa, Ta, d.Wa, d.NHa + d.KVHa, d.hs, false);
    if (!d.ring()) attend(k, a, kv, B, Ta, d.NHa, d.KVHa, d.hs, p.attention_products());
  });
  if (const ContextRing* ring = q.ring()) ring->forward(a.qkv, a.atty, a.att, B, T, products_of(w));
  if (q.active()) q.out_to_rows(a.atty, a.atty_rows, B, T);
  const float* atty = q.active() ? a.atty_rows : a.atty;
  k.submit([&k, w, a, d, BT, proj, bias, atty, ix, lora] {
    const Bound& p = **w;
    k.matmul_forward(proj, atty, p.p(ix.o), bias ? param(p, ix.o_b) : nullptr, BT, d.Cq, d.C);
    lora_forward(k, lora, LoraProduct::attn_out, atty, proj, BT, d.C, a.lora_h);
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

void llama_layer_backward(Kernels& k, const TensorGroup& g, const SequenceGroup& q, BoundRef w, const LayerActs& a, const Scratch& s,
                          const float* x, int B, int T, const MoePass& moe, const Spans& spans, const LayerLora* lora) {
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
  const float* atty = q.active() ? a.atty_rows : a.atty;
  k.submit([&k, w, a, s, d, BT, dout, atty, ix, lora] {
    const Bound& p = **w;
    k.matmul_backward(s.dC, p.g(ix.o), grad(p, ix.o_b), dout, atty, p.p(ix.o), BT, d.Cq, d.C);
    lora_backward(k, lora, LoraProduct::attn_out, atty, dout, s.dC, BT, d.C, a.lora_h);
  });
  const Scratch sa = attention_scratch(q, s, B, T);
  const int Ta = T * d.sq;
  const size_t BTa = d.attn_rows(BT);
  if (const ContextRing* ring = q.ring()) ring->backward(sa.dqkv, sa.dC, a.atty, a.qkv, a.att, B, T, products_of(w));
  k.submit([&k, w, a, s, sa, d, B, Ta, BTa, ix, spans] {
    const Bound& p = **w;
    if (!d.ring()) attention_backward_rows(k, spans, a, sa, B, Ta, d.NHa, d.KVHa, d.hs, d.probabilities, p.attention_products());
    // The gradient at the rotated q and k turned back: the gradient at the values before the turn.
    rope_rows(k, spans, s.dqkv, s.rope, BTa, Ta, d.Wa, d.NHa + d.KVHa, d.hs, true);
    if (!d.qk_norm) return;
    // v's gradient as it is, q's and k's through their norms.
    k.copy(s.dqk, s.dqkv, BTa * d.Wa);
    k.rmsnorm_backward(s.dqk, p.g(ix.q_norm), s.dqkv, a.qk_pre, p.p(ix.q_norm), a.qk_rstd, BTa, d.NHa, d.hs, d.Wa, false);
    const size_t at = static_cast<size_t>(d.NHa) * d.hs;
    k.rmsnorm_backward(s.dqk + at, p.g(ix.k_norm), s.dqkv + at, a.qk_pre + at, p.p(ix.k_norm), a.qk_rstd + BTa * d.NHa, BTa, d.KVHa,
                       d.hs, d.Wa, false);
  });
  const float* dproj = d.qk_norm ? s.dqk : s.dqkv;
  if (q.active()) q.qkv_grad_to_rows(dproj, s.sq_rows, B, T), dproj = s.sq_rows;
  k.submit([&k, w, a, d, BT, dproj, partial, ln1, ix, lora] {
    const Bound& p = **w;
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
