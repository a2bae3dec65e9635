// The mixture-of-experts gate on the host (see moe/router.h).
#include "models/moe/router.h"

#include <algorithm>  // std::partial_sort, std::max
#include <cmath>      // std::exp, std::log, std::ceil
#include <limits>     // std::numeric_limits
#include <numeric>    // std::iota

#include "core/error.h"

namespace zeroth::gpt {
namespace {

constexpr float kKeptFloor = std::numeric_limits<float>::epsilon();

}  // namespace

size_t moe_capacity(const MoeGate& gate, size_t N, double factor, int min_capacity) {
  if (!gate.drop_tokens) return N;
  const double share = static_cast<double>(N) * gate.top_k / gate.experts * factor;
  const size_t capacity = std::max(static_cast<size_t>(std::ceil(share)), static_cast<size_t>(std::max(min_capacity, 0)));
  return std::min(capacity, N);
}

double Routing::max_load() const {
  if (rows() == 0 || offsets.size() < 2) return 0;
  size_t most = 0;
  for (size_t e = 0; e + 1 < offsets.size(); ++e) most = std::max(most, offsets[e + 1] - offsets[e]);
  return static_cast<double>(most) * static_cast<double>(offsets.size() - 1) / static_cast<double>(rows());
}

Routing moe_route(const MoeGate& gate, const float* logits, float* probs, size_t N, size_t capacity) {
  const int E = gate.experts, k = gate.top_k;
  ZEROTH_CHECK(E >= 1 && k >= 1 && k <= E, "moe: top_k {} must be within 1 and the {} experts", k, E);
  Routing r;
  r.tokens = N;
  r.expert.assign(N * k, -1);
  r.row.assign(N * k, -1);
  r.weight.assign(N * k, 0.0f);
  r.lse.assign(N, 0.0f);
  r.mean_prob.assign(E, 0.0);
  r.first_fraction.assign(E, 0.0);
  std::vector<int> order(E);
  for (size_t n = 0; n < N; ++n) {
    const float* x = logits + n * E;
    float* p = probs + n * E;
    float max = x[0];
    for (int e = 1; e < E; ++e) max = std::max(max, x[e]);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += p[e] = std::exp(x[e] - max);
    for (int e = 0; e < E; ++e) p[e] /= sum;
    r.lse[n] = max + std::log(sum);
    r.z_loss += static_cast<double>(r.lse[n]) * r.lse[n];
    // The k most probable, ties to the lower index.
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [p](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    for (int j = 0; j < k; ++j) {
      r.expert[n * k + j] = order[j];
      r.weight[n * k + j] = p[order[j]];
    }
    for (int e = 0; e < E; ++e) r.mean_prob[e] += p[e];
    r.first_fraction[order[0]] += 1;
  }
  // Places in token order, every first choice before any second one: a choice takes the next
  // place of its expert, and those past the capacity are dropped (DeepSpeed's locations).
  std::vector<size_t> taken(E, 0);
  std::vector<size_t> place(N * k);
  for (int j = 0; j < k; ++j) {
    for (size_t n = 0; n < N; ++n) place[n * k + j] = taken[r.expert[n * k + j]]++;
  }
  r.offsets.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) r.offsets[e + 1] = r.offsets[e] + std::min(taken[e], capacity);
  r.row_token.assign(r.rows(), -1);
  for (size_t i = 0; i < N * k; ++i) {
    if (place[i] >= capacity) {
      r.weight[i] = 0;
      ++r.dropped;
      continue;
    }
    r.row[i] = static_cast<int32_t>(r.offsets[r.expert[i]] + place[i]);
    r.row_token[r.row[i]] = static_cast<int32_t>(i / k);
  }
  if (gate.normalize_top_k) {
    // Over the choices that kept their place, as DeepSpeed's top-2 and top-k gates do after
    // dropping (Mixtral's, which drops nothing, is the same): a token whose second choice is
    // dropped gives its first the whole weight. The sum is floored at f32's epsilon as DeepSpeed's.
    for (size_t n = 0; n < N; ++n) {
      float kept = 0;
      for (int j = 0; j < k; ++j) kept += r.weight[n * k + j];
      for (int j = 0; j < k; ++j) r.weight[n * k + j] /= std::max(kept, kKeptFloor);
    }
  }
  if (N > 0) {
    for (int e = 0; e < E; ++e) {
      r.mean_prob[e] /= static_cast<double>(N);
      r.first_fraction[e] /= static_cast<double>(N);
      r.aux_loss += E * r.mean_prob[e] * r.first_fraction[e];
    }
    r.z_loss /= static_cast<double>(N);
  }
  return r;
}

void moe_gate_backward(const MoeGate& gate, const Routing& routing, const float* probs, const float* dweight, float loss_scale,
                       float* dlogits) {
  const int E = gate.experts, k = gate.top_k;
  const size_t N = routing.tokens;
  // The auxiliary loss's gradient at each probability: d(E sum_e P_e f_e) / dp[n, e] = E f_e / N.
  std::vector<float> aux(E, 0.0f);
  for (int e = 0; e < E && N > 0; ++e) {
    aux[e] = static_cast<float>(loss_scale * gate.aux_loss_coef * E * routing.first_fraction[e] / static_cast<double>(N));
  }
  const float z = N > 0 ? static_cast<float>(loss_scale * gate.z_loss_coef * 2.0 / static_cast<double>(N)) : 0.0f;
  std::vector<float> dp(E);
  for (size_t n = 0; n < N; ++n) {
    const float* p = probs + n * E;
    const int32_t* chosen = routing.expert.data() + n * k;
    std::copy(aux.begin(), aux.end(), dp.begin());
    const int32_t* row = routing.row.data() + n * k;
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += row[j] < 0 ? 0.0f : p[chosen[j]];
    for (int j = 0; j < k; ++j) {
      if (row[j] < 0) continue;  // dropped: its weight is the constant 0
      const float g = dweight[n * k + j];
      if (!gate.normalize_top_k) {
        dp[chosen[j]] += g;
        continue;
      }
      // w_j = p_j / S, S the sum over the kept i floored at epsilon: dw_j / dp_i = [i == j] / S -
      // p_j / S^2 where the floor does not bite, [i == j] / epsilon where it does.
      const float S = std::max(sum, kKeptFloor);
      if (sum >= kKeptFloor) {
        const float across = g * p[chosen[j]] / (S * S);
        for (int i = 0; i < k; ++i) {
          if (row[i] >= 0) dp[chosen[i]] -= across;
        }
      }
      dp[chosen[j]] += g / S;
    }
    float dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[e];
    for (int e = 0; e < E; ++e) dlogits[n * E + e] = p[e] * (dp[e] - dot) + z * routing.lse[n] * p[e];
  }
}

}  // namespace zeroth::gpt
