// AVX-512 (F, BW, VL, DQ) kernels, 16 lanes. Built with -mavx512f -mavx512bw -mavx512vl
// -mavx512dq -mf16c -ffp-contract=off.
//
// The AVX512_BF16 conversion (vcvtneps2bf16) is not used for casts: it flushes subnormal inputs
// to zero and quiets NaNs, so it cannot match the exact scalar rounding. The integer
// round-to-nearest-even below costs four instructions per 16 lanes and the cast stays
// memory-bound.
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
  static constexpr size_t W = 16;
  using F = __m512;

  static F load_f32(const float* p) { return _mm512_loadu_ps(p); }
  static F load_bf16(const uint16_t* p) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  }
  static F load_f16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    __m512 f = _mm512_cvtph_ps(h);
    // The conversion quiets signalling NaNs; rebuild NaN lanes from the bits.
    const __mmask16 nan = _mm256_cmpgt_epu16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)),
                                                  _mm256_set1_epi16(0x7c00));
    if (nan) [[unlikely]] {
      const __m512i h32 = _mm512_cvtepu16_epi32(h);
      const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(h32, _mm512_set1_epi32(0x8000)), 16);
      const __m512i payload = _mm512_slli_epi32(_mm512_and_si512(h32, _mm512_set1_epi32(0x3ff)), 13);
      const __m512i bits = _mm512_or_si512(_mm512_or_si512(sign, payload), _mm512_set1_epi32(0x7f800000));
      f = _mm512_mask_blend_ps(nan, f, _mm512_castsi512_ps(bits));
    }
    return f;
  }

  template <bool NT>
  static void store_f32(float* p, F v) {
    if constexpr (NT) _mm512_stream_ps(p, v);
    else _mm512_storeu_ps(p, v);
  }
  template <bool NT>
  static void store_u16x16(uint16_t* p, __m256i v) {
    if constexpr (NT) _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
  template <bool NT>
  static void store_bf16(uint16_t* p, F v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i t = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(t, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    if (nan) [[unlikely]] {
      const __mmask16 empty = _mm512_testn_epi32_mask(t, _mm512_set1_epi32(0x7f));
      const __m512i quieted = _mm512_mask_or_epi32(t, empty, t, _mm512_set1_epi32(0x40));
      r = _mm512_mask_blend_epi32(nan, r, quieted);
    }
    store_u16x16<NT>(p, _mm512_cvtepi32_epi16(r));
  }
  template <bool NT>
  static void store_f16(uint16_t* p, F v) {
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i u = _mm512_castps_si512(v);
    const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000));
    if (nan) [[unlikely]] {
      const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000));
      const __m512i m = _mm512_and_si512(_mm512_srli_epi32(mag, 13), _mm512_set1_epi32(0x3ff));
      const __mmask16 empty = _mm512_testn_epi32_mask(m, m);
      const __m512i payload = _mm512_mask_or_epi32(m, empty, m, _mm512_set1_epi32(0x200));
      const __m512i bits = _mm512_or_si512(_mm512_or_si512(sign, payload), _mm512_set1_epi32(0x7c00));
      h = _mm256_mask_blend_epi16(nan, h, _mm512_cvtepi32_epi16(bits));
    }
    store_u16x16<NT>(p, h);
  }
  static void store_fence() { _mm_sfence(); }
  // d is 64-byte aligned.
  static void stream_copy_128(char* d, const char* s) {
    const __m512i a = _mm512_loadu_si512(s), b = _mm512_loadu_si512(s + 64);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d), a);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + 64), b);
  }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  // maxps returns its second operand when unordered; blending a's NaNs back in propagates both.
  static F max(F a, F b) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), _mm512_max_ps(a, b), a); }
};

#include "core/cpu/kernels_body.inc"
}  // namespace

const KernelTable& kernel_table_avx512() { return kTable; }

}  // namespace zeroth::cpu
