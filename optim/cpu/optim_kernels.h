// The CPU optimizer kernels' per-level table (the SIMD level comes from the core dispatcher).
#pragma once

#include <cstddef>  // size_t

#include "core/cpu/kernels.h"      // SimdLevel
#include "core/dtype.h"            // DType
#include "optim/step_constants.h"  // StepConstants, Kind

namespace zeroth::optim_cpu {

using optim::Kind;
using optim::StepConstants;

struct OptimTable {
  // One serial pass over n elements. nt: streaming stores for the copy-out.
  void (*step)(int kind, float* params, const void* grads, DType grad_type, float* m, float* v, void* out, DType out_type, size_t n,
               const StepConstants& c, bool nt);
  // Lamb's pass one over n elements: moments updated, w*w into lanes[0] and u*u into lanes[1]
  // (element i into lane i % 16).
  void (*lamb_norms)(const float* params, const void* grads, DType grad_type, float* m, float* v, size_t n, const StepConstants& c,
                     float lanes[2][16]);
  // Lamb's pass two: params -= lr_ratio * u.
  void (*lamb_apply)(float* params, const float* m, const float* v, void* out, DType out_type, size_t n, const StepConstants& c,
                     float lr_ratio, bool nt);
};

const OptimTable& optim_table(cpu::SimdLevel level);

}  // namespace zeroth::optim_cpu
