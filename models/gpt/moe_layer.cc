// An expert layer's MLP in two block uses (layers.h): the router in the layer's block, the rank's
// experts in their own block (partitioned by ZeRO over the ranks that hold the same experts).
// The gate runs on the host (moe_gate.h); each choice's row travels to the rank of its expert and
// back with the expert-parallel group's all-to-alls; each expert is an MLP of the architecture's
// kind (GPT-2's c_fc, GELU, c_proj with biases; the Llama family's w1/w3, SwiGLU, w2) on its rows.
#include <algorithm>  // std::max, std::min

#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"  // ZEROTH_CHECK
#include "models/gpt/layers.h"

namespace zeroth::gpt {

size_t Dims::moe_rows(size_t BT) const {
  const size_t every_choice = BT * gate.top_k;
  if (!gate.drop_tokens) return every_choice;
  const size_t capacity = moe_capacity(gate, BT, std::max(capacity_factor, eval_capacity_factor), min_capacity);
  return std::min(every_choice, capacity * gate.experts);
}

size_t Dims::moe_expert_rows(size_t BT) const {
  if (ep == 1) return moe_rows(BT);
  // From each rank (of at most the group's largest micro-batch): at most one row per token and local
  // expert, at most top_k per token, at most the local experts' capacities.
  BT = std::max(BT, ep_group_tokens);
  const size_t n = static_cast<size_t>(local_experts());
  size_t per_rank = BT * std::min<size_t>(gate.top_k, n);
  if (gate.drop_tokens)
    per_rank = std::min(per_rank, n * moe_capacity(gate, BT, std::max(capacity_factor, eval_capacity_factor), min_capacity));
  return per_rank * static_cast<size_t>(ep);
}

ExpertRows::ExpertRows(const Routing& r, int ep) {
  const int E = static_cast<int>(r.offsets.size()) - 1, n = E / ep;
  // Expert e is slot e mod n of rank e / n; its rows start at `start[e]` in slot-then-rank order.
  std::vector<size_t> start(E, 0);
  sent.assign(static_cast<size_t>(E), 0);
  size_t at = 0;
  for (int j = 0; j < n; ++j) {
    for (int p = 0; p < ep; ++p) {
      const int e = p * n + j;
      start[e] = at;
      sent[static_cast<size_t>(j) * ep + p] = r.offsets[e + 1] - r.offsets[e];
      at += sent[static_cast<size_t>(j) * ep + p];
    }
  }
  row.assign(r.row.size(), -1);
  row_token.assign(r.row_token.size(), 0);
  for (size_t c = 0; c < r.row.size(); ++c) {
    if (r.row[c] < 0) continue;
    const int e = r.expert[c];
    const size_t to = start[e] + (static_cast<size_t>(r.row[c]) - r.offsets[e]);
    row[c] = static_cast<int32_t>(to);
    row_token[to] = r.row_token[static_cast<size_t>(r.row[c])];
  }
}

size_t ExpertRows::sent_total() const {
  size_t n = 0;
  for (size_t v : sent) n += v;
  return n;
}
size_t ExpertRows::received_total() const {
  size_t n = 0;
  for (size_t v : received) n += v;
  return n;
}
size_t ExpertRows::received_in(int slot, int ep) const {
  size_t n = 0;
  for (int p = 0; p < ep; ++p) n += received[static_cast<size_t>(slot) * ep + p];
  return n;
}

void ExpertGroup::to_experts(const ExpertRows& rows, const float* mine, float* theirs, size_t room,
                             std::vector<size_t>* received) const {
  const int ep = dims_.ep, n = dims_.local_experts();
  const size_t C = static_cast<size_t>(dims_.C);
  if (comm_ == nullptr || ep == 1) {
    ZEROTH_CHECK(mine == theirs, "expert rows without a group stay in place");
    if (received != nullptr) *received = rows.sent;
    return;
  }
  std::vector<size_t> got_rows(rows.sent.size(), 0);
  size_t sent_at = 0, recv_at = 0;
  std::vector<size_t> counts(static_cast<size_t>(ep));
  for (int j = 0; j < n; ++j) {
    size_t total = 0;
    for (int p = 0; p < ep; ++p) total += counts[p] = rows.sent[static_cast<size_t>(j) * ep + p] * C;
    const TensorView send{const_cast<float*>(mine) + sent_at, total, DType::f32};
    const TensorView recv{theirs + recv_at, room * C - recv_at, DType::f32};
    const std::vector<size_t> got = comm_->all_to_allv(stream_, send, counts, recv);
    for (int p = 0; p < ep; ++p) {
      got_rows[static_cast<size_t>(j) * ep + p] = got[p] / C;
      recv_at += got[p];
    }
    sent_at += total;
  }
  // After every slot's exchange, so a rank that finds a difference has not left its peers waiting.
  if (received == nullptr) {
    ZEROTH_CHECK(got_rows == rows.received, "an expert layer's backward received other row counts than its forward: [{}] against [{}]",
                 fmt::join(got_rows, ", "), fmt::join(rows.received, ", "));
    return;
  }
  *received = std::move(got_rows);
}

void ExpertGroup::to_tokens(const ExpertRows& rows, const float* theirs, float* mine) const {
  const int ep = dims_.ep, n = dims_.local_experts();
  const size_t C = static_cast<size_t>(dims_.C);
  if (comm_ == nullptr || ep == 1) {
    ZEROTH_CHECK(mine == theirs, "expert rows without a group stay in place");
    return;
  }
  size_t sent_at = 0, recv_at = 0;
  std::vector<size_t> counts(static_cast<size_t>(ep));
  for (int j = 0; j < n; ++j) {
    size_t back = 0, total = 0;
    for (int p = 0; p < ep; ++p) {
      total += counts[p] = rows.received[static_cast<size_t>(j) * ep + p] * C;
      back += rows.sent[static_cast<size_t>(j) * ep + p] * C;
    }
    const TensorView send{const_cast<float*>(theirs) + recv_at, total, DType::f32};
    const TensorView recv{mine + sent_at, back, DType::f32};
    const std::vector<size_t> got = comm_->all_to_allv(stream_, send, counts, recv);
    for (int p = 0; p < ep; ++p) {
      ZEROTH_CHECK(got[p] == rows.sent[static_cast<size_t>(j) * ep + p] * C,
                   "expert slot {}: rank {} returned {} elements for the {} rows sent to it", j, p, got[p],
                   rows.sent[static_cast<size_t>(j) * ep + p]);
    }
    recv_at += total;
    sent_at += back;
  }
}

namespace {

// Parameter indices of local expert j in the experts' block: GPT-2's c_fc weight and bias, c_proj
// weight and bias; the Llama family's w1 (with w3 after it: one [2X, C] run) and w2.
struct ExpertParams {
  int fc, fc_b = -1, proj, proj_b = -1;
  ExpertParams(const Dims& d, int j) {
    if (d.llama) {
      fc = 3 * j, proj = fc + 2;
    } else {
      fc = 4 * j, fc_b = fc + 1, proj = fc + 2, proj_b = fc + 3;
    }
  }
};

const float* param(const Bound& b, int i) { return i >= 0 ? b.p(static_cast<size_t>(i)) : nullptr; }
float* grad(const Bound& b, int i) { return i >= 0 ? b.g(static_cast<size_t>(i)) : nullptr; }

// Where the received rows of local slot j start, and how many there are.
std::pair<size_t, size_t> slot_rows(const ExpertRows& rows, const Dims& d, int j) {
  size_t at = 0;
  for (int q = 0; q < j; ++q) at += rows.received_in(q, d.ep);
  return {at, rows.received_in(j, d.ep)};
}

}  // namespace

void moe_router_forward(Kernels& k, BoundRef w, int router, const Dims& d, const Scratch& s, const float* inp, size_t BT,
                        const MoePass& pass) {
  MoeActs& m = *pass.acts;
  const int E = d.gate.experts;
  m.logits.resize(BT * E);
  m.probs.resize(BT * E);
  float* logits = m.logits.data();
  k.submit([&k, w, router, d, s, inp, BT, E, logits] {
    k.matmul_forward(s.moe_logits, inp, (*w)->p(router), nullptr, BT, d.C, E);
    k.download(logits, s.moe_logits, BT * E);
  });
  pass.stream->synchronize();
  const double factor = pass.training ? d.capacity_factor : d.eval_capacity_factor;
  m.routing = moe_route(d.gate, m.logits.data(), m.probs.data(), BT, moe_capacity(d.gate, BT, factor, d.min_capacity));
  m.rows = ExpertRows(m.routing, d.ep);
  const Routing& r = m.routing;
  if (pass.stats != nullptr) {
    MoeStats& st = *pass.stats;
    ++st.passes;
    st.aux_loss += r.aux_loss, st.z_loss += r.z_loss;
    st.choices += BT * d.gate.top_k, st.dropped += r.dropped;
    st.max_load = std::max(st.max_load, r.max_load());
  }
}

void moe_experts_forward(Kernels& k, const ExpertGroup& g, BoundRef w, const Dims& d, const LayerActs& a, const Scratch& s,
                         const float* inp, float* out, const float* resid, size_t BT, const MoePass& pass) {
  MoeActs* m = pass.acts;
  const int K = d.gate.top_k, C = d.C;
  // With one rank the dispatched rows are the experts' inputs, and their outputs come back in place.
  float* dispatched = d.ep == 1 ? a.moe_in : s.moe_rows;
  float* outputs = d.ep == 1 ? a.moe_out : s.moe_eout;
  const size_t sent = m->rows.sent_total();
  k.submit([&k, a, m, inp, dispatched, C, sent] {
    k.upload(a.moe_row, m->rows.row.data(), m->rows.row.size() * sizeof(int32_t));
    k.upload(a.moe_token, m->rows.row_token.data(), m->rows.row_token.size() * sizeof(int32_t));
    k.upload(a.moe_weight, m->routing.weight.data(), m->routing.weight.size() * sizeof(float));
    k.moe_dispatch(dispatched, inp, a.moe_token, sent, C);
  });
  // A recomputation (no output) receives what the forward did: it only checks the counts, which the
  // forward's work may still be reading.
  g.to_experts(m->rows, dispatched, a.moe_in, d.moe_expert_rows(BT), out == nullptr ? nullptr : &m->rows.received);
  k.submit([&k, w, d, a, m, outputs] {
    const Bound& p = **w;
    const int X = d.X, up = d.expert_up();
    for (int j = 0; j < d.local_experts(); ++j) {
      const auto [at, n] = slot_rows(m->rows, d, j);
      if (n == 0) continue;  // an expert without tokens: nothing to compute, nothing to add
      const ExpertParams ix(d, j);
      float *fch = a.fch + at * up, *act = a.fch_act + at * X;
      k.matmul_forward(fch, a.moe_in + at * d.C, p.p(ix.fc), param(p, ix.fc_b), n, d.C, up);
      if (d.llama) k.swiglu_forward(act, fch, n, X);
      else k.gelu_forward(act, fch, n * X);
      k.matmul_forward(outputs + at * d.C, act, p.p(ix.proj), param(p, ix.proj_b), n, X, d.C);
    }
  });
  g.to_tokens(m->rows, outputs, a.moe_out);
  if (out == nullptr) return;
  // With sequence parallelism every rank combines all the tokens (the experts are replicated over the
  // tensor-parallel group) and keeps its rows.
  float* whole = d.sp ? s.partial : out;
  const size_t R = d.rows(BT), at = d.row_offset(BT);
  k.submit([&k, a, out, whole, resid, BT, K, C, R, at, sp = d.sp] {
    k.moe_combine(whole, a.moe_out, a.moe_row, a.moe_weight, BT, K, C);
    if (sp) k.copy(out, whole + at, R * C);
    k.accumulate(out, resid, R * C);
  });
}

void moe_experts_backward(Kernels& k, const ExpertGroup& g, BoundRef w, const Dims& d, const LayerActs& a, const Scratch& s,
                          const float* dout, size_t BT, const MoePass& pass) {
  MoeActs* m = pass.acts;
  const int K = d.gate.top_k, C = d.C;
  float* erows = d.ep == 1 ? s.moe_drows : s.moe_erows;
  float* einp = d.ep == 1 ? s.moe_dinp : s.moe_einp;
  m->dweight.resize(BT * K);
  float* dweight = m->dweight.data();
  k.submit([&k, s, a, dout, dweight, BT, K, C] {
    k.moe_combine_backward(s.moe_drows, s.moe_dweight, dout, a.moe_out, a.moe_row, a.moe_weight, BT, K, C);
    k.download(dweight, s.moe_dweight, BT * K);
  });
  g.to_experts(m->rows, s.moe_drows, erows, d.moe_expert_rows(BT), nullptr);
  k.submit([&k, w, d, a, s, m, erows, einp] {
    const Bound& p = **w;
    const int X = d.X, up = d.expert_up();
    for (int j = 0; j < d.local_experts(); ++j) {
      const auto [at, n] = slot_rows(m->rows, d, j);
      if (n == 0) continue;
      const ExpertParams ix(d, j);
      float* dact = d.llama ? s.dact + at * X : s.dfch + at * up;
      k.matmul_backward(dact, p.g(ix.proj), grad(p, ix.proj_b), erows + at * d.C, a.fch_act + at * X, p.p(ix.proj), n, X, d.C);
      if (d.llama) k.swiglu_backward(s.dfch + at * up, a.fch + at * up, dact, n, X);
      else k.gelu_backward(s.dfch + at * up, a.fch + at * up, dact, n * X);
      k.matmul_backward(einp + at * d.C, p.g(ix.fc), grad(p, ix.fc_b), s.dfch + at * up, a.moe_in + at * d.C, p.p(ix.fc), n, d.C, up);
    }
  });
  g.to_tokens(m->rows, einp, s.moe_dinp);
}

void moe_router_backward(Kernels& k, BoundRef w, int router, const Dims& d, const LayerActs& a, const Scratch& s, const float* inp,
                         float* dinp, size_t BT, const MoePass& pass) {
  MoeActs& m = *pass.acts;
  const int E = d.gate.experts, K = d.gate.top_k, C = d.C;
  pass.stream->synchronize();  // the combine weights' gradient on the host
  m.dlogits.resize(BT * E);
  moe_gate_backward(d.gate, m.routing, m.probs.data(), m.dweight.data(), pass.loss_scale, m.dlogits.data());
  const float* dlogits = m.dlogits.data();
  // The router's share of the input's gradient, then each kept choice's.
  k.submit([&k, w, router, a, s, inp, dinp, dlogits, BT, E, K, C] {
    k.upload(s.moe_dlogits, dlogits, BT * E * sizeof(float));
    k.matmul_backward(dinp, (*w)->g(router), nullptr, s.moe_dlogits, inp, (*w)->p(router), BT, C, E);
    k.moe_dispatch_backward(dinp, s.moe_dinp, a.moe_row, BT, K, C);
  });
}

}  // namespace zeroth::gpt
