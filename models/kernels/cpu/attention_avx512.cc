// Attention's inner loops on AVX-512: products in tiles of 6 rows x 4 vectors of 16 (24 of the
// 32 registers hold the tile); bf16 pair products as two fused multiply-adds (CPUs without
// AVX512-BF16).
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

struct Lanes : Avx512Lanes {};

#include "models/kernels/cpu/attention_tile.inc"

}  // namespace

const AttentionIsa& attention_isa_avx512() { return kIsa; }

}  // namespace zeroth::gpt::cpu
