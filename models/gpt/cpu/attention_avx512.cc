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
  // dst's row c (ldd apart) = src's column c, for a 16 x 16 square of src (rows ld apart): pairs
  // of rows interleaved, then 4 x 4 squares within each 128-bit lane, then lanes gathered. The
  // unpacks and lane shuffles are the zero-masked forms with every lane kept: GCC 12 warns that the
  // plain forms' undefined source is uninitialized (its bug 105593).
  static void transpose(const float* src, size_t ld, float* dst, size_t ldd) {
    constexpr __mmask16 kAll = 0xffff;
    F r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = load(src + i * ld);
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_maskz_unpacklo_ps(kAll, r[i], r[i + 1]);
      t[i + 1] = _mm512_maskz_unpackhi_ps(kAll, r[i], r[i + 1]);
    }
    // r[i + j], for i a multiple of 4: column 4 L + j of rows i..i+3 in 128-bit lane L.
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
      r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
      r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int j = 0; j < 4; ++j) {
      t[j] = _mm512_maskz_shuffle_f32x4(kAll, r[j], r[4 + j], 0x88);
      t[4 + j] = _mm512_maskz_shuffle_f32x4(kAll, r[j], r[4 + j], 0xdd);
      t[8 + j] = _mm512_maskz_shuffle_f32x4(kAll, r[8 + j], r[12 + j], 0x88);
      t[12 + j] = _mm512_maskz_shuffle_f32x4(kAll, r[8 + j], r[12 + j], 0xdd);
    }
    for (int j = 0; j < 4; ++j) {
      store(dst + j * ldd, _mm512_maskz_shuffle_f32x4(kAll, t[j], t[8 + j], 0x88));
      store(dst + (4 + j) * ldd, _mm512_maskz_shuffle_f32x4(kAll, t[4 + j], t[12 + j], 0x88));
      store(dst + (8 + j) * ldd, _mm512_maskz_shuffle_f32x4(kAll, t[j], t[8 + j], 0xdd));
      store(dst + (12 + j) * ldd, _mm512_maskz_shuffle_f32x4(kAll, t[4 + j], t[12 + j], 0xdd));
    }
  }
};

#include "models/gpt/cpu/attention_tile.inc"

}  // namespace

const AttentionIsa& attention_isa_avx512() { return kIsa; }

}  // namespace zeroth::gpt::cpu
