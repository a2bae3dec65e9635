// The transformer block's forward and backward around the tensor-parallel group's collectives.
#include "models/decoder/layers.h"

namespace zeroth::gpt {

Dims Dims::of(const GptConfig& c, const GptPart& part) {
  Dims d;
  d.tp = part.tp_ranks, d.tp_rank = part.tp_rank;
  d.ep = part.ep_ranks, d.ep_rank = part.ep_rank, d.ep_group_tokens = part.ep_group_tokens;
  d.sp = part.sequence_parallel && part.tp_ranks > 1;
  d.C = c.n_embd;
  d.llama = c.llama(), d.qkv_bias = c.qkv_bias, d.o_bias = c.o_bias, d.qk_norm = c.qk_norm;
  d.eps = static_cast<float>(c.norm_eps);
  d.probabilities = c.attention_probabilities;
  d.loss_rows = c.loss_chunk_rows;
  d.mlp_tile = c.mlp_tile_rows;
  d.NH = c.n_head / d.tp;
  d.KVH = c.kv_heads() / d.tp;
  d.hs = c.head_size();
  d.Cq = d.NH * d.hs;
  d.W = (d.NH + 2 * d.KVH) * d.hs;
  d.sq = part.sq_ranks, d.sq_rank = part.sq_rank;
  d.cp = part.cp_ranks, d.cp_rank = part.cp_rank;
  d.NHa = d.NH / d.sq;
  d.KVHa = d.KVH % d.sq == 0 ? d.KVH / d.sq : 1;
  d.Cqa = d.NHa * d.hs;
  d.Wa = (d.NHa + 2 * d.KVHa) * d.hs;
  const auto [f_lo, f_hi] = TensorSplit::part(c.ffn(), d.tp_rank, d.tp);
  d.F = static_cast<int>(f_hi - f_lo);
  if (c.moe.enabled()) {
    d.moe = true;
    d.gate = {c.moe.num_experts, c.moe.top_k, c.moe.drop_tokens, c.moe.normalize_top_k, c.moe.aux_loss_coef, c.moe.z_loss_coef};
    d.X = c.expert_ffn(), d.min_capacity = c.moe.min_capacity;
    d.capacity_factor = c.moe.capacity_factor, d.eval_capacity_factor = c.moe.eval_capacity_factor;
  }
  const auto [lo, hi] = TensorSplit::part(c.vocab_size, d.tp_rank, d.tp);
  d.v_lo = static_cast<int>(lo), d.V = static_cast<int>(hi - lo);
  return d;
}

Bound::Bound(Kernels& k, std::vector<TensorView> params, const std::vector<TensorView>* grads, const Buffer& wbuf, const Buffer& gbuf)
    : k_(k), has_grads_(grads != nullptr && !grads->empty()) {
  if (grads != nullptr) grads_ = *grads;
  size_t total = 0;
  for (const auto& p : params) total += p.numel;
  narrow_ = !params.empty() && params[0].dtype != DType::f32;
  if (narrow_ && has_grads_) k_.zero(gbuf.as<float>(), total);
  size_t off = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (narrow_) {
      k_.widen(params[i], wbuf.as<float>() + off);
      bf16_.push_back(params[i].dtype == DType::bf16 ? static_cast<const uint16_t*>(params[i].data) : nullptr);
      p_.push_back(wbuf.as<float>() + off);
      if (has_grads_) g_.push_back(gbuf.as<float>() + off);
    } else {
      p_.push_back(params[i].as<float>());
      if (has_grads_) g_.push_back(grads_[i].as<float>());
    }
    off += params[i].numel;
  }
}

void Bound::flush() const {
  if (!narrow_ || !has_grads_) return;
  for (size_t i = 0; i < grads_.size(); ++i) k_.add_into(grads_[i], g_[i]);
}

namespace {

// Parameter indices inside a transformer block, in block_specs order.
enum LayerParam { kLn1W, kLn1B, kAttnW, kAttnB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB };

}  // namespace

namespace {

// Floats of `att` (and datt) each row of a span owns: each row's log-sum-exp per head (the CPU's), or
// its probabilities against the T positions of its row (CUDA's), so spans never overlap there.
size_t att_per_row(bool probabilities, int NH, int T) { return static_cast<size_t>(NH) * (probabilities ? T : 1); }

}  // namespace

void rope_rows(Kernels& k, const Spans& spans, float* x, const float* table, size_t BT, int T, size_t ld, int heads, int hs,
               bool inverse) {
  if (!spans) return k.rope(x, table, BT, T, ld, heads, hs, inverse);
  for (const auto& [r0, n] : *spans) k.rope(x + static_cast<size_t>(r0) * ld, table, n, n, ld, heads, hs, inverse);
}

void attention_backward_rows(Kernels& k, const Spans& spans, const LayerActs& a, const Scratch& s, int B, int T, int NH, int KVH,
                             int hs, bool probabilities, DType products) {
  if (!spans) return k.attention_backward(s.dqkv, s.datt, s.dC, a.atty, a.qkv, a.att, B, T, NH, KVH, hs, products);
  const size_t W = static_cast<size_t>(NH + 2 * KVH) * hs, Cq = static_cast<size_t>(NH) * hs, A = att_per_row(probabilities, NH, T);
  for (const auto& [r0, n] : *spans) {
    const size_t r = static_cast<size_t>(r0);
    k.attention_backward(s.dqkv + r * W, s.datt != nullptr ? s.datt + r * A : nullptr, s.dC + r * Cq, a.atty + r * Cq, a.qkv + r * W,
                         a.att + r * A, 1, n, NH, KVH, hs, products);
  }
}

Scratch attention_scratch(const SequenceGroup& q, const Scratch& s, int B, int T) {
  if (!q.active()) return s;
  q.out_grad_to_heads(s.dC, s.sq_datt, B, T);
  Scratch sa = s;
  sa.dC = s.sq_datt;
  return sa;
}

ContextRing::Products products_of(BoundRef w) {
  return [w] { return (*w)->attention_products(); };
}

void attend(Kernels& k, const LayerActs& a, const KvCache& kv, int B, int T, int NH, int KVH, int hs, DType products) {
  if (kv.rows == nullptr && kv.spans) {
    const size_t W = static_cast<size_t>(NH + 2 * KVH) * hs, Cq = static_cast<size_t>(NH) * hs;
    const size_t A = att_per_row(kv.probabilities, NH, T);
    for (const auto& [r0, n] : *kv.spans) {
      const size_t r = static_cast<size_t>(r0);
      k.attention_forward(a.atty + r * Cq, a.att + r * A, a.qkv + r * W, 1, n, NH, KVH, hs, products);
    }
    return;
  }
  if (kv.rows == nullptr) {
    k.attention_forward(a.atty, a.att, a.qkv, B, T, NH, KVH, hs, products);
    return;
  }
  const size_t n = static_cast<size_t>(B) * T, W = static_cast<size_t>(NH + 2 * KVH) * hs;
  k.copy(kv.rows + static_cast<size_t>(kv.pos) * W, a.qkv, n * W);
  k.attention_rows(a.atty, kv.att, kv.rows, kv.pos, static_cast<int>(n), NH, KVH, hs);
}

void layer_forward(Kernels& k, const TensorGroup& g, const SequenceGroup& q, BoundRef w, const LayerActs& a, const Scratch& s,
                   const float* x, float* out, int B, int T, KvCache kv, const MoePass& moe, const LayerLora* lora) {
  if (g.dims().llama) return llama_layer_forward(k, g, q, w, a, s, x, out, B, T, kv, moe, lora);
  const Dims d = g.dims();
  const size_t BT = static_cast<size_t>(B) * T, R = d.rows(BT);
  // Row-parallel outputs are partial sums: the bias joins on rank 0 only, so the sum holds it once.
  const bool bias = d.tp_rank == 0;
  float* proj = d.sp ? s.partial : a.res2;
  k.submit([&k, w, a, x, d, R] {
    const Bound& p = **w;
    k.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.p(kLn1W), p.p(kLn1B), R, d.C);
  });
  const float* ln1 = g.gathered_rows(a.ln1, s.ln_whole, BT);
  float* qkv = q.active() ? s.sq_rows : a.qkv;
  k.submit([&k, w, a, d, BT, ln1, qkv, lora] {
    const Bound& p = **w;
    k.matmul_forward(qkv, ln1, p.p(kAttnW), p.p(kAttnB), BT, d.C, 3 * d.Cq);
    lora_forward(k, lora, LoraProduct::qkv, ln1, qkv, BT, 3 * d.Cq, a.lora_h);
  });
  if (q.active()) q.qkv_to_heads(qkv, a.qkv, B, T);
  const int Ta = T * d.sq;
  if (const ContextRing* ring = q.ring()) {
    ring->forward(a.qkv, a.atty, a.att, B, T, products_of(w));
  } else {
    k.submit([&k, w, a, d, B, Ta, kv] { attend(k, a, kv, B, Ta, d.NHa, d.NHa, d.hs, (*w)->attention_products()); });
  }
  if (q.active()) q.out_to_rows(a.atty, a.atty_rows, B, T);
  const float* atty = q.active() ? a.atty_rows : a.atty;
  k.submit([&k, w, a, d, BT, proj, bias, atty, lora] {
    const Bound& p = **w;
    k.matmul_forward(proj, atty, p.p(kProjW), bias ? p.p(kProjB) : nullptr, BT, d.Cq, d.C);
    lora_forward(k, lora, LoraProduct::attn_out, atty, proj, BT, d.C, a.lora_h);
  });
  g.reduce(proj, a.res2, BT);
  k.submit([&k, w, a, x, d, R] {
    const Bound& p = **w;
    k.accumulate(a.res2, x, R * d.C);
    k.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.p(kLn2W), p.p(kLn2B), R, d.C);
  });
  const float* ln2 = g.gathered_rows(a.ln2, s.ln_whole, BT);
  float* down = out == nullptr ? nullptr : d.sp ? s.partial : out;
  if (moe.expert_layer) {
    // The router ends this block's use; the experts' block adds the MLP's output (moe_experts_forward).
    // A recomputation keeps the forward's routing.
    if (out != nullptr) moe_router_forward(k, w, kFcW, d, s, ln2, BT, moe);
    return;
  } else {
    const MlpIx ix{kFcW, kFcB, kFcProjW, bias ? kFcProjB : -1, kFcProjB};
    k.submit([&k, w, a, s, d, BT, down, ln2, ix, lora] { mlp_forward(k, **w, ix, d, a, s, ln2, down, BT, lora); });
  }
  if (out == nullptr) return;
  g.reduce(down, out, BT);
  k.submit([&k, a, out, d, R] { k.accumulate(out, a.res2, R * d.C); });
}

void layer_backward(Kernels& k, const TensorGroup& g, const SequenceGroup& q, BoundRef w, const LayerActs& a, const Scratch& s,
                    const float* x, int B, int T, const MoePass& moe, const Spans& spans, const LayerLora* lora) {
  if (g.dims().llama) return llama_layer_backward(k, g, q, w, a, s, x, B, T, moe, spans, lora);
  const Dims d = g.dims();
  const size_t BT = static_cast<size_t>(B) * T, R = d.rows(BT);
  // The column-parallel inputs' gradients are partial sums over the ranks.
  float* partial = d.sp ? s.partial : s.dC;
  // Sequence parallelism: the weight gradients of the column-parallel products need their inputs
  // whole, gathered again from the rows kept.
  const float* dout = g.gathered_rows(s.dresid, s.gathered, BT);
  const float* ln2 = g.gathered_rows(a.ln2, s.ln_whole, BT);
  if (moe.expert_layer) {
    moe_router_backward(k, w, kFcW, d, a, s, ln2, partial, BT, moe);
    g.keep_rows(partial, s.dC, BT);  // every rank's is whole (the experts are replicated over the group)
  } else {
    const MlpIx ix{kFcW, kFcB, kFcProjW, -1, kFcProjB};
    k.submit([&k, w, a, s, d, BT, dout, partial, ln2, ix, lora] { mlp_backward(k, **w, ix, d, a, s, ln2, dout, partial, BT, lora); });
    g.reduce(partial, s.dC, BT);
  }
  k.submit([&k, w, a, s, d, R] {
    const Bound& p = **w;
    k.layernorm_backward(s.dresid, p.g(kLn2W), p.g(kLn2B), s.dC, a.res2, p.p(kLn2W), a.ln2_mean, a.ln2_rstd, R, d.C);
  });
  dout = g.gathered_rows(s.dresid, s.gathered, BT);
  const float* ln1 = g.gathered_rows(a.ln1, s.ln_whole, BT);
  const float* atty = q.active() ? a.atty_rows : a.atty;
  k.submit([&k, w, a, s, d, BT, dout, atty, lora] {
    const Bound& p = **w;
    k.matmul_backward(s.dC, p.g(kProjW), p.g(kProjB), dout, atty, p.p(kProjW), BT, d.Cq, d.C);
    lora_backward(k, lora, LoraProduct::attn_out, atty, dout, s.dC, BT, d.C, a.lora_h);
  });
  const Scratch sa = attention_scratch(q, s, B, T);
  if (const ContextRing* ring = q.ring()) {
    ring->backward(sa.dqkv, sa.dC, a.atty, a.qkv, a.att, B, T, products_of(w));
  } else {
    k.submit([&k, w, a, sa, d, B, T, spans] {
      attention_backward_rows(k, spans, a, sa, B, T * d.sq, d.NHa, d.NHa, d.hs, d.probabilities, (*w)->attention_products());
    });
  }
  const float* dqkv = s.dqkv;
  if (q.active()) q.qkv_grad_to_rows(s.dqkv, s.sq_rows, B, T), dqkv = s.sq_rows;
  k.submit([&k, w, a, d, BT, dqkv, partial, ln1, lora] {
    const Bound& p = **w;
    k.matmul_backward(partial, p.g(kAttnW), p.g(kAttnB), dqkv, ln1, p.p(kAttnW), BT, d.C, 3 * d.Cq);
    lora_backward(k, lora, LoraProduct::qkv, ln1, dqkv, partial, BT, 3 * d.Cq, a.lora_h);
  });
  g.reduce(partial, s.dC, BT);
  k.submit([&k, w, a, s, x, d, R] {
    const Bound& p = **w;
    k.layernorm_backward(s.dresid, p.g(kLn1W), p.g(kLn1B), s.dC, x, p.p(kLn1W), a.ln1_mean, a.ln1_rstd, R, d.C);
  });
}

}  // namespace zeroth::gpt
