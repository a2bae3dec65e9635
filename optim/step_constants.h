// What an optimizer step computes once before any kernel runs, and which update it is: shared by
// the CPU kernels and the CUDA kernel (plain C++, so nvcc reads it too).
#pragma once

namespace zeroth::optim {

struct StepConstants {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
  float decay_factor;    // adamw / lion: 1 - lr * weight_decay
  float step_size;       // adam: lr / bias_correction1
  float inv_bias2_sqrt;  // adam: 1 / sqrt(bias_correction2)
  float grad_scale;
  float momentum, one_minus_dampening;  // sgd
  bool first_step;                      // sgd: the momentum buffer starts as the gradient
};

enum class Kind : int { adam_l2, adamw, sgd, sgd_momentum, sgd_nesterov, lion, ceiling };

}  // namespace zeroth::optim
