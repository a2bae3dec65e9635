// Attention's inner loops on AVX-512 with AVX512-BF16: as attention_avx512.cc, with the bf16 pair
// products on vdpbf16ps (one instruction for two terms: twice the f32 rate).
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

#include "models/kernels/cpu/attention_avx512_lanes.inc"

struct Lanes : Avx512Lanes {
  // The roundings on vcvtne2ps2bf16 (nearest even; it reads a subnormal as 0, as vdpbf16ps does).
  static U pair_rows(F even, F odd) {
    // [even's 16, odd's 16] in bf16, interleaved.
    const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(odd, even));
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
                                           19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(order, both);
  }
  static void store_pairs_along(uint32_t* dst, F lo, F hi) {
    _mm512_storeu_si512(dst, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
  struct NativePairs {
    using A = __m512i;
    using B = __m512i;
    static A broadcast(uint32_t a) { return _mm512_set1_epi32(static_cast<int>(a)); }
    static B load(const uint32_t* p) { return _mm512_loadu_si512(p); }
    static B load_part(const uint32_t* p, int n) { return _mm512_maskz_loadu_epi32(first(n), p); }
    static F madd(F acc, A a, B b) { return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b)); }
  };
};

#include "models/kernels/cpu/attention_tile.inc"

}  // namespace

const AttentionIsa& attention_isa_avx512_bf16() { return kIsa; }

}  // namespace zeroth::gpt::cpu
