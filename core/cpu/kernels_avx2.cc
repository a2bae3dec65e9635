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

struct Isa {
  static constexpr size_t W = 8;
  using F = __m256;

  // 8 x u32 -> 8 x u16 (values already fit in 16 bits).
  static __m128i narrow(__m256i v) {
    const __m256i packed = _mm256_packus_epi32(v, v);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
  }

  static F load_f32(const float* p) { return _mm256_loadu_ps(p); }
  static F load_bf16(const uint16_t* p) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }
  static F load_f16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    __m256 f = _mm256_cvtph_ps(h);
    // F16C quiets signalling NaNs; rebuild NaN lanes from the bits so the payload survives.
    const __m256i h32 = _mm256_cvtepu16_epi32(h);
    const __m256i mag = _mm256_and_si256(h32, _mm256_set1_epi32(0x7fff));
    const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7c00));
    if (!_mm256_testz_si256(nan, nan)) [[unlikely]] {
      const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h32, _mm256_set1_epi32(0x8000)), 16);
      const __m256i payload = _mm256_slli_epi32(_mm256_and_si256(h32, _mm256_set1_epi32(0x3ff)), 13);
      const __m256i bits = _mm256_or_si256(_mm256_or_si256(sign, payload), _mm256_set1_epi32(0x7f800000));
      f = _mm256_blendv_ps(f, _mm256_castsi256_ps(bits), _mm256_castsi256_ps(nan));
    }
    return f;
  }

  template <bool NT>
  static void store_f32(float* p, F v) {
    if constexpr (NT) _mm256_stream_ps(p, v);
    else _mm256_storeu_ps(p, v);
  }
  template <bool NT>
  static void store_u16x8(uint16_t* p, __m128i v) {
    if constexpr (NT) _mm_stream_si128(reinterpret_cast<__m128i*>(p), v);
    else _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
  }
  template <bool NT>
  static void store_bf16(uint16_t* p, F v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
    if (!_mm256_testz_si256(nan, nan)) [[unlikely]] {
      const __m256i t = _mm256_srli_epi32(u, 16);
      const __m256i empty = _mm256_cmpeq_epi32(_mm256_and_si256(t, _mm256_set1_epi32(0x7f)), _mm256_setzero_si256());
      const __m256i quieted = _mm256_or_si256(t, _mm256_and_si256(empty, _mm256_set1_epi32(0x40)));
      r = _mm256_blendv_epi8(r, quieted, nan);
    }
    store_u16x8<NT>(p, narrow(r));
  }
  template <bool NT>
  static void store_f16(uint16_t* p, F v) {
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i u = _mm256_castps_si256(v);
    const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
    if (!_mm256_testz_si256(nan, nan)) [[unlikely]] {
      const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000));
      const __m256i m = _mm256_and_si256(_mm256_srli_epi32(mag, 13), _mm256_set1_epi32(0x3ff));
      const __m256i empty = _mm256_cmpeq_epi32(m, _mm256_setzero_si256());
      const __m256i payload = _mm256_or_si256(m, _mm256_and_si256(empty, _mm256_set1_epi32(0x200)));
      const __m256i bits = _mm256_or_si256(_mm256_or_si256(sign, payload), _mm256_set1_epi32(0x7c00));
      h = _mm_blendv_epi8(h, narrow(bits), narrow(_mm256_srli_epi32(nan, 16)));
    }
    store_u16x8<NT>(p, h);
  }
  static void store_fence() { _mm_sfence(); }
  // d is 64-byte aligned.
  static void stream_copy_128(char* d, const char* s) {
    for (int k = 0; k < 4; ++k) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32 * k), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32 * k)));
    }
  }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  // maxps returns its second operand when unordered; blending a's NaNs back in propagates both.
  static F max(F a, F b) { return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q)); }
};

#include "core/cpu/kernels_body.inc"
}  // namespace

const KernelTable& kernel_table_avx2() { return kTable; }

}  // namespace zeroth::cpu
