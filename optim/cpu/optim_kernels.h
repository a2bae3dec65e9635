// The optimizer kernels' per-level table (the SIMD level comes from the core dispatcher) and the
// constants one step computes once.
#pragma once

#include <cstddef>  // size_t

#include "core/cpu/kernels.h"  // SimdLevel
#include "core/dtype.h"        // DType

namespace zeroth::optim_cpu {

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

struct OptimTable {
  // One serial pass over n elements. nt: streaming stores for the copy-out.
  void (*step)(int kind, float* params, const void* grads, DType grad_type, float* m, float* v, void* out,
               DType out_type, size_t n, const StepConstants& c, bool nt);
};

const OptimTable& optim_table(cpu::SimdLevel level);

}  // namespace zeroth::optim_cpu
