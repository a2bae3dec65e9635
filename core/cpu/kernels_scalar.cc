// Scalar kernels: the reference level, runs on any x86-64.
#include <algorithm>    // std::max
#include <cstdint>      // uint16_t, uint32_t, uintptr_t
#include <cstring>      // memcpy
#include <type_traits>  // std::conditional_t

#include "core/cpu/kernels.h"

namespace zeroth::cpu {
namespace {
#include "core/cpu/convert_scalar.inc"

struct Isa {
  static constexpr size_t W = 1;
  using F = float;
  static F load_f32(const float* p) { return *p; }
  static F load_bf16(const uint16_t* p) { return bits_f32(scalar_bf16_to_f32(*p)); }
  static F load_f16(const uint16_t* p) { return bits_f32(scalar_f16_to_f32(*p)); }
  template <bool NT> static void store_f32(float* p, F v) { *p = v; }
  template <bool NT> static void store_bf16(uint16_t* p, F v) { *p = scalar_f32_to_bf16(f32_bits(v)); }
  template <bool NT> static void store_f16(uint16_t* p, F v) { *p = scalar_f32_to_f16(f32_bits(v)); }
  static void store_fence() {}
  static void stream_copy_128(char* d, const char* s) { std::memcpy(d, s, 128); }
  static F set1(float v) { return v; }
  static F add(F a, F b) { return a + b; }
  static F mul(F a, F b) { return a * b; }
  // a > b ? a : b, except that a NaN in a wins (a NaN in b already does): NaNs propagate.
  static F max(F a, F b) { return a != a ? a : (a > b ? a : b); }
};

#include "core/cpu/kernels_body.inc"
}  // namespace

const KernelTable& kernel_table_scalar() { return kTable; }

}  // namespace zeroth::cpu
