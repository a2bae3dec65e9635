// An expert layer's MLP: the router's product, the gate on the host (moe_gate.h), the rows moved to
// their experts, each expert's MLP on its own rows (GPT-2's c_fc, GELU, c_proj with biases; the
// Llama family's w1/w3, SwiGLU, w2), and the weighted combine; backward the same in reverse, with
// the gate's gradient (the combine weights' and the auxiliary losses') into the router's.
#include <algorithm>  // std::max

#include "models/gpt/layers.h"

namespace zeroth::gpt {

size_t Dims::moe_rows(size_t BT) const {
  const size_t every_choice = BT * gate.top_k;
  if (!gate.drop_tokens) return every_choice;
  const size_t capacity = moe_capacity(gate, BT, std::max(capacity_factor, eval_capacity_factor), min_capacity);
  return std::min(every_choice, capacity * gate.experts);
}

namespace {

// Parameter indices of expert e, after the router at `first`: GPT-2's c_fc weight and bias, c_proj
// weight and bias; the Llama family's w1 (with w3 after it: one [2X, C] run) and w2.
struct ExpertParams {
  int fc, fc_b = -1, proj, proj_b = -1;
  ExpertParams(const Dims& d, int first, int e) {
    if (d.llama) {
      fc = first + 1 + 3 * e, proj = fc + 2;
    } else {
      fc = first + 1 + 4 * e, fc_b = fc + 1, proj = fc + 2, proj_b = fc + 3;
    }
  }
};

const float* param(const Bound& b, int i) { return i >= 0 ? b.p(static_cast<size_t>(i)) : nullptr; }
float* grad(const Bound& b, int i) { return i >= 0 ? b.g(static_cast<size_t>(i)) : nullptr; }

}  // namespace

void moe_forward(Kernels& k, BoundRef w, int first, const Dims& d, const LayerActs& a, const Scratch& s, const float* inp, float* out,
                 size_t BT, const MoePass& pass) {
  k.submit([&k, w, first, d, a, s, inp, out, BT, pass] {
    const Bound& p = **w;
    const int E = d.gate.experts, K = d.gate.top_k, C = d.C, X = d.X, up = d.expert_up();
    MoeActs& m = *a.moe;
    k.matmul_forward(s.moe_logits, inp, p.p(first), nullptr, BT, C, E);
    m.logits.resize(BT * E);
    m.probs.resize(BT * E);
    k.download(m.logits.data(), s.moe_logits, BT * E);
    k.synchronize();
    const double factor = pass.training ? d.capacity_factor : d.eval_capacity_factor;
    m.routing = moe_route(d.gate, m.logits.data(), m.probs.data(), BT, moe_capacity(d.gate, BT, factor, d.min_capacity));
    const Routing& r = m.routing;
    if (pass.stats != nullptr) {
      MoeStats& st = *pass.stats;
      ++st.passes;
      st.aux_loss += r.aux_loss, st.z_loss += r.z_loss;
      st.choices += BT * K, st.dropped += r.dropped;
      st.max_load = std::max(st.max_load, r.max_load());
    }
    k.upload(a.moe_row, r.row.data(), r.row.size() * sizeof(int32_t));
    k.upload(a.moe_token, r.row_token.data(), r.row_token.size() * sizeof(int32_t));
    k.upload(a.moe_weight, r.weight.data(), r.weight.size() * sizeof(float));
    k.moe_dispatch(s.moe_rows, inp, a.moe_token, r.rows(), C);
    for (int e = 0; e < E; ++e) {
      const size_t at = r.offsets[e], n = r.offsets[e + 1] - at;
      if (n == 0) continue;  // an expert without tokens: nothing to compute, nothing to add
      const ExpertParams ix(d, first, e);
      float *fch = a.fch + at * up, *act = a.fch_act + at * X;
      k.matmul_forward(fch, s.moe_rows + at * C, p.p(ix.fc), param(p, ix.fc_b), n, C, up);
      if (d.llama) k.swiglu_forward(act, fch, n, X);
      else k.gelu_forward(act, fch, n * X);
      k.matmul_forward(a.moe_out + at * C, act, p.p(ix.proj), param(p, ix.proj_b), n, X, C);
    }
    if (out != nullptr) k.moe_combine(out, a.moe_out, a.moe_row, a.moe_weight, BT, K, C);
  });
}

void moe_backward(Kernels& k, BoundRef w, int first, const Dims& d, const LayerActs& a, const Scratch& s, const float* inp,
                  const float* dout, float* dinp, size_t BT, const MoePass& pass) {
  k.submit([&k, w, first, d, a, s, inp, dout, dinp, BT, pass] {
    const Bound& p = **w;
    const int E = d.gate.experts, K = d.gate.top_k, C = d.C, X = d.X, up = d.expert_up();
    MoeActs& m = *a.moe;
    const Routing& r = m.routing;
    k.moe_combine_backward(s.moe_drows, s.moe_dweight, dout, a.moe_out, a.moe_row, a.moe_weight, BT, K, C);
    m.dweight.resize(BT * K);
    m.dlogits.resize(BT * E);
    k.download(m.dweight.data(), s.moe_dweight, BT * K);
    k.synchronize();
    moe_gate_backward(d.gate, r, m.probs.data(), m.dweight.data(), pass.loss_scale, m.dlogits.data());
    k.upload(s.moe_dlogits, m.dlogits.data(), m.dlogits.size() * sizeof(float));
    // The experts' inputs again (cheaper to move than to keep).
    k.moe_dispatch(s.moe_rows, inp, a.moe_token, r.rows(), C);
    for (int e = 0; e < E; ++e) {
      const size_t at = r.offsets[e], n = r.offsets[e + 1] - at;
      if (n == 0) continue;
      const ExpertParams ix(d, first, e);
      float* dact = d.llama ? s.dact + at * X : s.dfch + at * up;
      k.matmul_backward(dact, p.g(ix.proj), grad(p, ix.proj_b), s.moe_drows + at * C, a.fch_act + at * X, p.p(ix.proj), n, X, C);
      if (d.llama) k.swiglu_backward(s.dfch + at * up, a.fch + at * up, dact, n, X);
      else k.gelu_backward(s.dfch + at * up, a.fch + at * up, dact, n * X);
      k.matmul_backward(s.moe_dinp + at * C, p.g(ix.fc), grad(p, ix.fc_b), s.dfch + at * up, s.moe_rows + at * C, p.p(ix.fc), n, C,
                        up);
    }
    // The router's share of the input's gradient, then each kept choice's.
    k.matmul_backward(dinp, p.g(first), nullptr, s.moe_dlogits, inp, p.p(first), BT, C, E);
    k.moe_dispatch_backward(dinp, s.moe_dinp, a.moe_row, BT, K, C);
  });
}

}  // namespace zeroth::gpt
