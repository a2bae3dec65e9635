// Attention's inner loops on AVX-512 with AVX512-BF16: as attention_avx512.cc, with the bf16 pair
// products on vdpbf16ps (one instruction for two terms: twice the f32 rate).
#include <immintrin.h>

#include <algorithm>    // std::min, std::fill
#include <array>        // std::array
#include <bit>          // std::bit_cast
#include <cstdint>      // uint32_t
#include <type_traits>  // std::is_same_v
#include <utility>      // std::integer_sequence

#include "models/gpt/cpu/attention_isa.h"

namespace zeroth::gpt::cpu {
namespace {

#include "models/gpt/cpu/attention_avx512_lanes.inc"

struct Lanes : Avx512Lanes {
  struct NativePairs {
    using A = __m512i;
    using B = __m512i;
    static A broadcast(uint32_t a) { return _mm512_set1_epi32(static_cast<int>(a)); }
    static B load(const uint32_t* p) { return _mm512_loadu_si512(p); }
    static B load_part(const uint32_t* p, int n) { return _mm512_maskz_loadu_epi32(first(n), p); }
    static F madd(F acc, A a, B b) { return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b)); }
  };
};

#include "models/gpt/cpu/attention_tile.inc"

}  // namespace

const AttentionIsa& attention_isa_avx512_bf16() { return kIsa; }

}  // namespace zeroth::gpt::cpu
