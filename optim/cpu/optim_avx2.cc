// Optimizer kernels at the avx2 level (flags in optim/CMakeLists.txt).
#include <immintrin.h>

#include <algorithm>    // std::max
#include <cstdint>      // uint16_t, uint32_t, uintptr_t
#include <cstring>      // memcpy
#include <type_traits>  // std::conditional_t

#include "core/dtype.h"
#include "optim/cpu/optim_kernels.h"

namespace zeroth::optim_cpu {
namespace {
#include "core/cpu/convert_scalar.inc"

#include "core/cpu/isa_scalar.inc"
#include "core/cpu/isa_avx2.inc"


#include "core/cpu/kernel_access.inc"
#include "optim/cpu/optim_body.inc"
}  // namespace

const OptimTable& optim_table_avx2() {
  static constexpr OptimTable table{&optim_step_fn, &lamb_norms_fn, &lamb_apply_fn};
  return table;
}

}  // namespace zeroth::optim_cpu
