// Rounding f32 to bf16 as the CPU's GPT kernels do it, for the files built per ISA too.
#pragma once

#include <cstdint>  // uint16_t, uint32_t
#include <cstring>  // std::memcpy

namespace zeroth::gpt::cpu {

// x rounded to bf16, nearest even, as cpu::cast rounds (a NaN stays a NaN: its payload's high bits,
// or a quiet bit where those are all 0). Internal linkage: the files built with their own -m flags
// (attention_avx2.cc, ...) each keep their own copy, so none reaches a CPU through another's.
static inline uint16_t bf16_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint32_t nearest = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, cut = u >> 16;
  const uint32_t nan = (cut & 0x007fu) != 0 ? cut : (cut | 0x0040u);
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : nearest);
}

// The pair (even, odd) in bf16: the low half holds the even term.
static inline uint32_t pair_of(float even, float odd) { return bf16_of(even) | static_cast<uint32_t>(bf16_of(odd)) << 16; }

}  // namespace zeroth::gpt::cpu
