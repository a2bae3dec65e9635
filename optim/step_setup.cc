// The step's constants and checks, shared by the CPU and CUDA paths.
#include "optim/step_setup.h"

#include <cmath>  // std::pow, std::sqrt

#include "core/error.h"  // ZEROTH_CHECK

namespace zeroth::optim {

Kind kind_of(const OptimizerParams& p) {
  switch (p.kind) {
    case OptimizerKind::adam: return Kind::adam_l2;
    case OptimizerKind::adamw: return Kind::adamw;
    case OptimizerKind::lion: return Kind::lion;
    case OptimizerKind::lamb: return Kind::lamb;
    case OptimizerKind::sgd:
      if (p.momentum == 0.0) return Kind::sgd;
      return p.nesterov ? Kind::sgd_nesterov : Kind::sgd_momentum;
  }
  return Kind::adamw;
}

StepConstants make_constants(const OptimizerParams& p, const OptimizerStep& s) {
  auto f = [](double x) { return static_cast<float>(x); };
  StepConstants c{};
  c.lr = f(s.lr);
  c.beta1 = f(p.beta1);
  c.beta2 = f(p.beta2);
  c.one_minus_beta1 = f(1.0 - p.beta1);
  c.one_minus_beta2 = f(1.0 - p.beta2);
  c.eps = f(p.eps);
  c.weight_decay = f(p.weight_decay);
  c.decay_factor = f(1.0 - s.lr * p.weight_decay);
  c.grad_scale = s.grad_scale;
  c.momentum = f(p.momentum);
  c.one_minus_dampening = f(1.0 - p.dampening);
  c.first_step = s.step == 1;
  const double bias1 = p.bias_correction ? 1.0 - std::pow(p.beta1, static_cast<double>(s.step)) : 1.0;
  const double bias2 = p.bias_correction ? 1.0 - std::pow(p.beta2, static_cast<double>(s.step)) : 1.0;
  c.step_size = f(s.lr / bias1);
  c.inv_bias2_sqrt = f(1.0 / std::sqrt(bias2));
  // DeepSpeed's fused_lamb_cuda: the bias corrections scale the step, outside the trust ratio.
  c.lamb_step_size = f(s.lr * std::sqrt(bias2) / bias1);
  c.max_coeff = f(p.max_coeff);
  c.min_coeff = f(p.min_coeff);
  c.eps_inside_sqrt = p.eps_inside_sqrt;
  return c;
}

void check_step(const OptimizerParams& p, const OptimizerStep& s) {
  if (s.count == 0) return;
  ZEROTH_CHECK(s.params != nullptr && s.grads != nullptr, "optimizer step over {} parameters with null params or grads", s.count);
  ZEROTH_CHECK(s.step >= 1, "optimizer step number must start at 1, got {}", s.step);
  for (int k = 0; k < p.state_arrays(); ++k) {
    ZEROTH_CHECK(s.state[k] != nullptr, "{} needs {} state array(s); state[{}] is null", optimizer_name(p.kind), p.state_arrays(), k);
  }
}

}  // namespace zeroth::optim
