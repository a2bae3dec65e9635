// Attention's inner loops on AVX-512: products in tiles of 6 rows x 4 vectors of 16 (24 of the
// 32 registers hold the tile).
#include <immintrin.h>

#include <algorithm>  // std::min, std::fill
#include <array>      // std::array
#include <utility>    // std::integer_sequence

#include "models/gpt/cpu/attention_isa.h"

namespace zeroth::gpt::cpu {
namespace {

struct Lanes {
  static constexpr int W = 16, kRowsPerTile = 6, kVectorsPerTile = 4;
  using F = __m512;
  static __mmask16 first(int n) { return static_cast<__mmask16>((1u << n) - 1); }
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load_part(const float* p, int n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void store_part(float* p, F v, int n) { _mm512_mask_storeu_ps(p, first(n), v); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  // b where either is NaN, as maxps/minps give it.
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  // p 2^n for integral n, exact while the result is normal.
  static F scale_pow2(F p, F n) { return _mm512_scalef_ps(p, n); }
  // v where x >= t or x is NaN, else 0.
  static F zero_below(F v, F x, float t) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, set1(t), _CMP_NLT_UQ), v); }
};

#include "models/gpt/cpu/attention_tile.inc"

}  // namespace

const AttentionIsa& attention_isa_avx512() { return kIsa; }

}  // namespace zeroth::gpt::cpu
