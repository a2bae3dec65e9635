// Rotary position embedding (the Llama family), applied in place.
// Included by cuda_backend.cu, which launches them (one translation unit, as llm.c's llmc/ is).
#pragma once

#include "models/kernels/cuda/cuda_common.cuh"  // kThreads, kWarp, warp and block reductions

namespace zeroth::gpt {

// One thread per rotated pair (n, h, i).
__global__ void rope_kernel(float* x, const float* table, size_t N, int T, size_t ld, int heads, int hs, float sign) {
  const int half = hs / 2;
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= N * heads * half) return;
  const size_t n = i / (static_cast<size_t>(heads) * half);
  const int h = static_cast<int>(i / half % heads), p = static_cast<int>(i % half);
  const float* cs = table + (n % T) * hs;
  float* v = x + n * ld + static_cast<size_t>(h) * hs;
  const float a = v[p], b = v[half + p], c = cs[p], sn = sign * cs[half + p];
  v[p] = a * c - b * sn;
  v[half + p] = b * c + a * sn;
}

}  // namespace zeroth::gpt
