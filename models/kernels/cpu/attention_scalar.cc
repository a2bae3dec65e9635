// Attention's inner loops without vectors (the scalar level): std::fma, so its bits are the vector
// levels'. Also the dispatch between levels.
#include <algorithm>    // std::min, std::fill
#include <array>        // std::array
#include <bit>          // std::bit_cast
#include <cstdint>      // uint32_t
#include <type_traits>  // std::is_same_v
#include <cmath>        // std::fma, std::ldexp, std::isnan
#include <utility>      // std::integer_sequence

#include "models/kernels/cpu/attention_isa.h"
#include "models/kernels/cpu/bf16_round.h"  // bf16_of, pair_of

namespace zeroth::gpt::cpu {
namespace {

struct Lanes {
  static constexpr int W = 1, kRowsPerTile = 4, kVectorsPerTile = 4;
  using F = float;
  static F zero() { return 0.0f; }
  static F set1(float x) { return x; }
  static F load(const float* p) { return *p; }
  static F load_part(const float* p, int /*n*/) { return *p; }
  static void store(float* p, F v) { *p = v; }
  static void store_part(float* p, F v, int /*n*/) { *p = v; }
  static F fma(F a, F b, F c) { return std::fma(a, b, c); }
  // A pair of bf16, and each half as the f32 it stands for (the low half is the even term).
  using U = uint32_t;
  static U load_u(const uint32_t* p) { return *p; }
  static U load_u_part(const uint32_t* p, int /*n*/) { return *p; }
  static F low_half(U u) { return std::bit_cast<float>(u << 16); }
  static F high_half(U u) { return std::bit_cast<float>(u & 0xffff0000u); }
  static void store_u(uint32_t* p, U u) { *p = u; }
  static U pair_rows(F even, F odd) { return pair_of(even, odd); }
  // One lane and its neighbour (W = 1).
  static void store_pairs_along(uint32_t* dst, F lo, F hi) { *dst = pair_rows(lo, hi); }
  static F mul(F a, F b) { return a * b; }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  // b where either is NaN, as the vector levels' maxps gives it.
  static F max(F a, F b) { return a > b ? a : b; }
  // p 2^n where x >= t or x is NaN, else 0.
  static F scale_pow2_from(F p, F n, F x, float t) {
    if (x < t) return 0.0f;
    return std::isnan(n) ? n : std::ldexp(p, static_cast<int>(n));
  }
  template <class T>
  static void transpose(const T* src, size_t /*ld*/, T* dst, size_t /*ldd*/) {
    *dst = *src;
  }
};

#include "models/kernels/cpu/attention_tile.inc"

}  // namespace

const AttentionIsa& attention_isa_scalar() { return kIsa; }

const AttentionIsa& attention_isa(zeroth::cpu::SimdLevel level) {
  switch (level) {
    case zeroth::cpu::SimdLevel::avx512:
      return zeroth::cpu::cpu_features().avx512_bf16 ? attention_isa_avx512_bf16() : attention_isa_avx512();
    case zeroth::cpu::SimdLevel::avx2:
      // Every AVX2 CPU made has FMA, but the level does not promise it.
      if (zeroth::cpu::cpu_features().fma) return attention_isa_avx2();
      break;
    case zeroth::cpu::SimdLevel::scalar: break;
  }
  return kIsa;
}

}  // namespace zeroth::gpt::cpu
