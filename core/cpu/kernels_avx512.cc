// AVX-512 (F, BW, VL, DQ) kernels, 16 lanes. Built with -mavx512f -mavx512bw -mavx512vl
// -mavx512dq -mf16c -ffp-contract=off.
#include <immintrin.h>

#include <algorithm>    // std::max
#include <cstdint>      // uint16_t, uint32_t, uintptr_t
#include <cstring>      // memcpy
#include <type_traits>  // std::conditional_t

#include "core/cpu/kernels.h"

namespace zeroth::cpu {
namespace {
#include "core/cpu/convert_scalar.inc"

#include "core/cpu/isa_avx512.inc"

#include "core/cpu/kernels_body.inc"
}  // namespace

const KernelTable& kernel_table_avx512() { return kTable; }

}  // namespace zeroth::cpu
