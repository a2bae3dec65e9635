// What the CPU's GPT kernels share: the per-ISA cloning of their row loops, an exp that
// vectorizes, a few row loops, and the split of rows over oneTBB.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cstddef>  // size_t
#include <cstdint>  // int32_t
#include <cstring>  // std::memcpy

#include "core/cpu/kernels.h"               // cpu::num_threads
#include "models/kernels/cpu/bf16_round.h"  // bf16_of

#ifdef ZEROTH_NO_ISA_CLONES
#define ZEROTH_ISA_CLONES
#else
#define ZEROTH_ISA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

namespace zeroth::gpt::cpu {

// expf to ~2 ulp on [-87, 88] (Cephes' polynomial), written so loops over it vectorize; 0 below
// -87, where expf leaves the normal range (a product of such a value with another must not come
// out ~1e-38 larger than it is).
inline float fast_exp(float x_in) {
  const float x = x_in < -87.0f ? -87.0f : (x_in > 88.0f ? 88.0f : x_in);
  const float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float n = x * 1.44269504088896341f + kMagic;
  n -= kMagic;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof scale);
  return x_in < -87.0f ? 0.0f : p * scale;
}

// Row loops of row_kernels.cc, cloned per ISA there. Sums and maxima run in 16 lanes combined in a
// fixed order, so they vectorize without reassociation.
float row_max(const float* x, int n);  // -3e38 for n = 0
// x[j] = exp(x[j] - shift) for j < n; returns their sum.
float exp_shifted_sum(float* x, int n, float shift);
void scale_row(float* x, int n, float a);

// f(i) for i in [0, n), split over oneTBB in chunks of `grain`.
template <class F>
void for_rows(size_t n, size_t grain, F&& f) {
  if (zeroth::cpu::num_threads() == 1) {
    // A rank per core (or a TSan run): no task arena shared with the other rank threads.
    for (size_t i = 0; i < n; ++i) f(i);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n, grain), [&](const tbb::blocked_range<size_t>& r) {
    for (size_t i = r.begin(); i < r.end(); ++i) f(i);
  });
}

}  // namespace zeroth::gpt::cpu
