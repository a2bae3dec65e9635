// AVX2 + F16C kernels (8 lanes). Built with -mavx2 -mf16c -ffp-contract=off.
#include <immintrin.h>

#include <algorithm>    // std::max
#include <cstdint>      // uint16_t, uint32_t, uintptr_t
#include <cstring>      // memcpy
#include <type_traits>  // std::conditional_t

#include "core/cpu/kernels.h"

namespace zeroth::cpu {
namespace {
#include "core/cpu/convert_scalar.inc"

#include "core/cpu/isa_avx2.inc"

#include "core/cpu/kernels_body.inc"
}  // namespace

const KernelTable& kernel_table_avx2() { return kTable; }

}  // namespace zeroth::cpu
