// An expert layer's MLP in two block uses (layers.h): the router in the layer's block, the rank's
// experts in their own block (partitioned by ZeRO over the ranks that hold the same experts).
// The gate runs on the host (moe/router.h); each choice's row travels to the rank of its expert and
// back with the expert-parallel group's all-to-alls; each expert is an MLP of the architecture's
// kind (GPT-2's c_fc, GELU, c_proj with biases; the Llama family's w1/w3, SwiGLU, w2) on its rows.
#include <algorithm>  // std::max, std::min
#include <array>      // std::array

#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"  // ZEROTH_CHECK
#include "models/decoder/layers.h"

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
  const size_t received = d.moe_expert_rows(BT);
  const ExpertGroup::SlotWork expert = [&k, w, d, a, outputs, lora = pass.lora, received](int j, size_t at, size_t n) {
    if (n == 0) return;  // an expert without tokens: nothing to compute, nothing to add
    k.submit([&k, w, d, a, outputs, lora, received, j, at, n] {
      const Bound& p = **w;
      const int X = d.X, up = d.expert_up();
      const ExpertParams ix(d, j);
      const LayerLora* adapters = lora != nullptr ? &(*lora)[static_cast<size_t>(j)] : nullptr;
      float *fch = a.fch + at * up, *act = a.fch_act + at * X, *in = a.moe_in + at * d.C;
      k.matmul_forward(fch, in, p.p(ix.fc), param(p, ix.fc_b), n, d.C, up);
      lora_forward(k, adapters, LoraProduct::mlp_up, in, fch, n, up, a.moe_lora_h, received, at);
      if (d.llama) k.swiglu_forward(act, fch, n, X);
      else k.gelu_forward(act, fch, n * X);
      k.matmul_forward(outputs + at * d.C, act, p.p(ix.proj), param(p, ix.proj_b), n, X, d.C);
      lora_forward(k, adapters, LoraProduct::mlp_down, act, outputs + at * d.C, n, d.C, a.moe_lora_h, received, at);
    });
  };
  // A recomputation (no output) receives what the forward did, and checks the counts.
  g.round_trip(m->rows, out != nullptr, {dispatched, a.moe_in, d.moe_expert_rows(BT), outputs, a.moe_out}, expert, [] {});
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
  // Each slot's input gradient first, sent back while the later slots and then every slot's weight
  // gradients compute.
  std::vector<std::array<size_t, 2>> slots;  // each slot's received rows, for the weight gradients
  const size_t received = d.moe_expert_rows(BT);
  // The adapters' gradients are made with the inputs' (they are small), each expert's before its
  // rows go back.
  const ExpertGroup::SlotWork input_grads =
      [&k, w, d, a, s, erows, einp, &slots, lora = pass.lora, received](int j, size_t at, size_t n) {
    slots.push_back({at, n});
    if (n == 0) return;
    k.submit([&k, w, d, a, s, erows, einp, lora, received, j, at, n] {
      const Bound& p = **w;
      const int X = d.X, up = d.expert_up();
      const ExpertParams ix(d, j);
      const LayerLora* adapters = lora != nullptr ? &(*lora)[static_cast<size_t>(j)] : nullptr;
      float* dact = d.llama ? s.dact + at * X : s.dfch + at * up;
      k.matmul_backward(dact, nullptr, nullptr, erows + at * d.C, a.fch_act + at * X, p.p(ix.proj), n, X, d.C);
      lora_backward(k, adapters, LoraProduct::mlp_down, a.fch_act + at * X, erows + at * d.C, dact, n, d.C, a.moe_lora_h, received,
                    at);
      if (d.llama) k.swiglu_backward(s.dfch + at * up, a.fch + at * up, dact, n, X);
      else k.gelu_backward(s.dfch + at * up, a.fch + at * up, dact, n * X);
      k.matmul_backward(einp + at * d.C, nullptr, nullptr, s.dfch + at * up, a.moe_in + at * d.C, p.p(ix.fc), n, d.C, up);
      lora_backward(k, adapters, LoraProduct::mlp_up, a.moe_in + at * d.C, s.dfch + at * up, einp + at * d.C, n, up, a.moe_lora_h,
                    received, at);
    });
  };
  auto weight_grads = [&k, w, d, a, s, erows, &slots] {
    k.submit([&k, w, d, a, s, erows, slots] {
      const Bound& p = **w;
      const int X = d.X, up = d.expert_up();
      for (int j = 0; j < d.local_experts(); ++j) {
        const auto [at, n] = slots[static_cast<size_t>(j)];
        if (n == 0) continue;
        const ExpertParams ix(d, j);
        // The weights only say which products these are (bf16 ones in a bf16 run); no input gradient is made.
        k.matmul_backward(nullptr, p.g(ix.proj), grad(p, ix.proj_b), erows + at * d.C, a.fch_act + at * X, p.p(ix.proj), n, X, d.C);
        k.matmul_backward(nullptr, p.g(ix.fc), grad(p, ix.fc_b), s.dfch + at * up, a.moe_in + at * d.C, p.p(ix.fc), n, d.C, up);
      }
    });
  };
  g.round_trip(m->rows, false, {s.moe_drows, erows, d.moe_expert_rows(BT), einp, s.moe_dinp}, input_grads, weight_grads);
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
