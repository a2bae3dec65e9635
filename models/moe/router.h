// The gate of a mixture-of-experts layer, on host memory: softmax over the router's logits in f32,
// top-k choice, the capacity rule of GShard and DeepSpeed-MoE (choices placed in token order, every
// token's first choice before any second one; a choice past its expert's capacity is dropped) or
// none (dropless), the combine weights (renormalised over the choices that kept their place, as
// DeepSpeed's top-2 and top-k gates do after dropping and Mixtral, which drops nothing, does; or the
// probabilities as they are), the load-balancing loss of GShard (E x sum over experts of the mean
// probability times the fraction of tokens whose first choice it is) and ST-MoE's router z-loss
// (the mean squared log-sum-exp of the logits); and the gradient of all of it at the logits.
#pragma once

#include <cstddef>  // size_t
#include <cstdint>  // int32_t
#include <vector>   // std::vector

namespace zeroth::gpt {

struct MoeGate {
  int experts = 8;
  int top_k = 2;
  bool drop_tokens = true;
  bool normalize_top_k = false;
  double aux_loss_coef = 0.01;
  double z_loss_coef = 0;
};

// Choices each expert takes from N tokens: ceil(N k / E x factor), at least min_capacity, at most N
// (an expert gets a token once); N without drop_tokens, so nothing is dropped.
size_t moe_capacity(const MoeGate& gate, size_t N, double factor, int min_capacity);

// Where N tokens go. Choice j of token n is entry n k + j (j = 0 the most probable).
struct Routing {
  size_t tokens = 0;
  std::vector<int32_t> expert;  // the chosen expert
  std::vector<int32_t> row;     // its row in the dispatched rows, -1 when dropped
  std::vector<float> weight;    // its combine weight, 0 when dropped
  // Expert e's rows are [offsets[e], offsets[e + 1]) of the dispatched rows, in placement order
  // (first choices in token order, then second choices, ...).
  std::vector<size_t> offsets;
  std::vector<int32_t> row_token;  // the token each dispatched row holds
  size_t dropped = 0;              // choices past their expert's capacity
  // The losses, without their coefficients, and what their gradients need: per expert the mean
  // probability and the fraction of tokens choosing it first (before capacity); per token the
  // log-sum-exp of its logits.
  double aux_loss = 0, z_loss = 0;
  std::vector<double> mean_prob, first_fraction;
  std::vector<float> lse;
  size_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
  // The busiest expert's rows over the mean rows per expert (1: perfectly balanced).
  double max_load() const;
};

// probs [N, E] = softmax(logits [N, E]); the routing of the N tokens with `capacity` per expert.
Routing moe_route(const MoeGate& gate, const float* logits, float* probs, size_t N, size_t capacity);

// dlogits [N, E] (overwritten): the gradient at the logits of
//   sum over kept choices of dweight[n k + j] x weight[n k + j]
//   + loss_scale x (aux_loss_coef x aux_loss + z_loss_coef x z_loss),
// where dweight is the gradient at the combine weights and loss_scale the factor the model's loss
// gradient carries (loss scaling, 1 / accumulation steps).
void moe_gate_backward(const MoeGate& gate, const Routing& routing, const float* probs, const float* dweight, float loss_scale,
                       float* dlogits);

}  // namespace zeroth::gpt
