// Lamb in float64, written from its definition (You et al. 2019, as DeepSpeed's FusedLamb forms it):
// one step of one whole tensor.
#pragma once

#include <algorithm>  // std::min, std::max
#include <cmath>      // std::pow, std::sqrt
#include <cstdint>    // int64_t
#include <vector>     // std::vector

#include "optim/optimizer.h"

namespace zeroth::testing {

struct LambReference {
  double ratio = 0;            // the trust ratio applied
  double unclamped = 0;        // ||w|| / ||u|| (0 when a norm is 0)
  std::vector<double> update;  // u
};

inline LambReference lamb_reference_step(const OptimizerParams& o, double lr, int64_t t, std::vector<double>& p,
                                         const std::vector<double>& g, std::vector<double>& m, std::vector<double>& v) {
  const double b1 = o.beta1, b2 = o.beta2;
  const double bc1 = o.bias_correction ? 1 - std::pow(b1, t) : 1, bc2 = o.bias_correction ? 1 - std::pow(b2, t) : 1;
  LambReference r;
  r.update.resize(p.size());
  double w_sq = 0, u_sq = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    // DeepSpeed's lamb_cuda_kernel_part1/3: u from the moments as they are; the bias corrections
    // scale the step below, outside the trust ratio.
    const double denom = o.eps_inside_sqrt ? std::sqrt(v[i] + o.eps) : std::sqrt(v[i]) + o.eps;
    r.update[i] = m[i] / denom + o.weight_decay * p[i];
    w_sq += p[i] * p[i];
    u_sq += r.update[i] * r.update[i];
  }
  r.ratio = 1;
  if (w_sq > 0 && u_sq > 0) {
    r.unclamped = std::sqrt(w_sq) / std::sqrt(u_sq);
    r.ratio = std::max(o.min_coeff, std::min(o.max_coeff, r.unclamped));
  }
  const double step_size = lr * std::sqrt(bc2) / bc1;
  for (size_t i = 0; i < p.size(); ++i) p[i] -= step_size * r.ratio * r.update[i];
  return r;
}

}  // namespace zeroth::testing
