// Scalar kernels: the reference level, runs on any x86-64.
#include <algorithm>    // std::max
#include <cstdint>      // uint16_t, uint32_t, uintptr_t
#include <cstring>      // memcpy
#include <type_traits>  // std::conditional_t

#include "core/cpu/kernels.h"

namespace zeroth::cpu {
namespace {
#include "core/cpu/convert_scalar.inc"

#include "core/cpu/isa_scalar.inc"
using Isa = ScalarIsa;

#include "core/cpu/kernels_body.inc"
}  // namespace

const KernelTable& kernel_table_scalar() { return kTable; }

}  // namespace zeroth::cpu
