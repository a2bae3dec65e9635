// Attention's inner loops on AVX2 with FMA: products in tiles of 6 rows x 2 vectors of 8 (12 of the
// 16 registers hold the tile).
#include <immintrin.h>

#include <algorithm>    // std::min, std::fill
#include <array>        // std::array
#include <bit>          // std::bit_cast
#include <cstdint>      // uint32_t
#include <type_traits>  // std::is_same_v
#include <utility>      // std::integer_sequence

#include "models/kernels/cpu/attention_isa.h"
#include "models/kernels/cpu/bf16_round.h"  // bf16_of, pair_of

namespace zeroth::gpt::cpu {
namespace {

struct Lanes {
  static constexpr int W = 8, kRowsPerTile = 6, kVectorsPerTile = 2;
  using F = __m256;
  static __m256i first(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F load_part(const float* p, int n) { return _mm256_maskload_ps(p, first(n)); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void store_part(float* p, F v, int n) { _mm256_maskstore_ps(p, first(n), v); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  // 8 pairs of bf16 as 32-bit lanes, and each half as the f32 it stands for (the low half is the
  // even term).
  using U = __m256i;
  static U load_u(const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static U load_u_part(const uint32_t* p, int n) { return _mm256_maskload_epi32(reinterpret_cast<const int*>(p), first(n)); }
  static F low_half(U u) { return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16)); }
  static F high_half(U u) { return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(0xffff0000u)))); }
  static void store_u(uint32_t* p, U u) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), u); }
  // x rounded to bf16 as bf16_of rounds (nearest even; a NaN stays a NaN), in each lane's low half.
  static U bf16_bits(F x) {
    const U u = _mm256_castps_si256(x), cut = _mm256_srli_epi32(u, 16), one = _mm256_set1_epi32(1);
    const U nearest = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_and_si256(cut, one), _mm256_set1_epi32(0x7fff))),
                                        16);
    const U quiet = _mm256_cmpeq_epi32(_mm256_and_si256(cut, _mm256_set1_epi32(0x7f)), _mm256_setzero_si256());
    const U nan = _mm256_or_si256(cut, _mm256_and_si256(quiet, _mm256_set1_epi32(0x40)));
    const U is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_epi8(nearest, nan, is_nan);
  }
  // Lane i: the pair (even[i], odd[i]) in bf16.
  static U pair_rows(F even, F odd) { return _mm256_or_si256(bf16_bits(even), _mm256_slli_epi32(bf16_bits(odd), 16)); }
  // The 16 lanes of lo then hi as 8 bf16 pairs of neighbours at dst: each 64-bit lane's two
  // roundings joined in its low 32 bits, those gathered in order.
  static void store_pairs_along(uint32_t* dst, F lo, F hi) {
    auto joined = [](F x) {
      const U b = bf16_bits(x);
      return _mm256_castsi256_ps(_mm256_or_si256(b, _mm256_srli_epi64(b, 16)));
    };
    const __m256 lows = _mm256_shuffle_ps(joined(lo), joined(hi), 0x88);  // lo 0 2, hi 0 2 | lo 4 6, hi 4 6
    store_u(dst, _mm256_permute4x64_epi64(_mm256_castps_si256(lows), 0xd8));
  }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  // b where either is NaN, as maxps gives it.
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  // p 2^n for integral n, by adding n to p's exponent (exact while the result is normal), where
  // x >= t or x is NaN, else 0.
  static F scale_pow2_from(F p, F n, F x, float t) {
    const __m256 scaled = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23)));
    return _mm256_and_ps(scaled, _mm256_cmp_ps(x, set1(t), _CMP_NLT_UQ));
  }
  // dst's row c (ldd apart) = src's column c, for an 8 x 8 square of src (rows ld apart): pairs of
  // rows interleaved, then 4 x 4 squares within each 128-bit half, then halves gathered.
  // T is float or a 32-bit pair: only bits move (the intrinsics' loads and stores may alias).
  template <class T>
  static void transpose(const T* src_t, size_t ld, T* dst_t, size_t ldd) {
    static_assert(sizeof(T) == 4);
    const auto* src = reinterpret_cast<const float*>(src_t);
    auto* dst = reinterpret_cast<float*>(dst_t);
    F r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = load(src + i * ld);
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
      r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
      r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int j = 0; j < 4; ++j) {
      store(dst + j * ldd, _mm256_permute2f128_ps(r[j], r[4 + j], 0x20));
      store(dst + (4 + j) * ldd, _mm256_permute2f128_ps(r[j], r[4 + j], 0x31));
    }
  }
};

#include "models/kernels/cpu/attention_tile.inc"

}  // namespace

const AttentionIsa& attention_isa_avx2() { return kIsa; }

}  // namespace zeroth::gpt::cpu
