// CPU feature detection (cpuid + xgetbv) and the choice of kernel level.
#include <cpuid.h>

#include <cstring>  // memcpy

#include "core/cpu/kernels.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

namespace zeroth::cpu {

namespace {

uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;

  __get_cpuid(1, &a, &b, &c, &d);
  f.sse42 = c & bit_SSE4_2;
  f.fma = c & bit_FMA;
  f.f16c = c & bit_F16C;
  const bool osxsave = c & bit_OSXSAVE;
  f.avx = c & bit_AVX;
  if (osxsave) {
    const uint64_t xcr0 = read_xcr0();
    f.os_avx = (xcr0 & 0x6) == 0x6;       // SSE and AVX state
    f.os_avx512 = (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  }
  if (max_leaf >= 7) {
    __get_cpuid_count(7, 0, &a, &b, &c, &d);
    f.avx2 = b & bit_AVX2;
    f.avx512f = b & bit_AVX512F;
    f.avx512dq = b & bit_AVX512DQ;
    f.avx512bw = b & bit_AVX512BW;
    f.avx512vl = b & bit_AVX512VL;
    f.avx512_fp16 = d & (1u << 23);
    f.amx_bf16 = d & (1u << 22);
    __get_cpuid_count(7, 1, &a, &b, &c, &d);
    f.avx512_bf16 = a & (1u << 5);
  }
  // Features the OS does not save are unusable, whatever cpuid says.
  if (!f.os_avx) f.avx = f.avx2 = f.fma = f.f16c = false;
  if (!f.os_avx512) f.avx512f = f.avx512dq = f.avx512bw = f.avx512vl = f.avx512_bf16 = f.avx512_fp16 = false;

  unsigned brand[12] = {};
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
    for (unsigned i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002 + i, &brand[4 * i], &brand[4 * i + 1], &brand[4 * i + 2], &brand[4 * i + 3]);
    }
    char text[49] = {};
    std::memcpy(text, brand, 48);
    f.brand = text;
    while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
  }
  return f;
}

SimdLevel detect_best(const CpuFeatures& f) {
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.f16c) return SimdLevel::avx512;
  if (f.avx2 && f.f16c) return SimdLevel::avx2;
  return SimdLevel::scalar;
}

SimdLevel detect_active() {
  const SimdLevel best = best_simd_level();
  auto cap = env::get(env::kSimd);
  if (!cap) return best;
  SimdLevel wanted = SimdLevel::scalar;
  try {
    wanted = parse_simd_level(*cap);
  } catch (const Error& e) {
    ZLOG_WARN("{}: {}; using {}", env::kSimd, e.what(), simd_level_name(best));
    return best;
  }
  return wanted < best ? wanted : best;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

SimdLevel best_simd_level() {
  static const SimdLevel level = detect_best(cpu_features());
  return level;
}

SimdLevel active_simd_level() {
  static const SimdLevel level = detect_active();
  return level;
}

std::vector<SimdLevel> supported_simd_levels() {
  std::vector<SimdLevel> levels;
  for (auto l : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512}) {
    if (l <= best_simd_level()) levels.push_back(l);
  }
  return levels;
}

std::string_view simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::scalar: return "scalar";
    case SimdLevel::avx2: return "avx2";
    case SimdLevel::avx512: return "avx512";
  }
  return "invalid";
}

SimdLevel parse_simd_level(std::string_view name) {
  for (auto l : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512}) {
    if (name == simd_level_name(l)) return l;
  }
  ZEROTH_THROW(InvalidArgument, "unknown SIMD level '{}' (use scalar, avx2 or avx512)", name);
}

}  // namespace zeroth::cpu
