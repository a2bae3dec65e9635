// The CPU optimizer kernels' per-level table (the SIMD level comes from the core dispatcher).
#pragma once

#include <cstddef>  // size_t

#include "core/cpu/kernels.h"  // SimdLevel
#include "core/dtype.h"        // DType
#include "optim/step_constants.h"  // StepConstants, Kind

namespace zeroth::optim_cpu {

using optim::Kind;
using optim::StepConstants;

struct OptimTable {
  // One serial pass over n elements. nt: streaming stores for the copy-out.
  void (*step)(int kind, float* params, const void* grads, DType grad_type, float* m, float* v, void* out,
               DType out_type, size_t n, const StepConstants& c, bool nt);
};

const OptimTable& optim_table(cpu::SimdLevel level);

}  // namespace zeroth::optim_cpu
