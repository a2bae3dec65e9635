// Attention's causal softmax and its backward.
// Included by cuda_backend.cu, which launches them (one translation unit, as llm.c's llmc/ is).
#pragma once

#include "models/kernels/cuda/cuda_common.cuh"  // kThreads, kWarp, warp and block reductions

namespace zeroth::gpt {

// Causal softmax of each row of att (rows of T; row r is query position pos + r mod q), in place;
// zeros past the query's position. The whole sequence's attention: q = T, pos = 0.
__global__ void causal_softmax_kernel(float* att, size_t rows, int T, int q, int pos) {
  const size_t row = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int t = pos + static_cast<int>(row % q);
  float* a = att + row * T;
  float m = -INFINITY;
  for (int j = lane; j <= t; j += kWarp) m = fmaxf(m, a[j]);
  m = warp_max(m);
  float s = 0;
  for (int j = lane; j <= t; j += kWarp) {
    const float e = expf(a[j] - m);
    a[j] = e;
    s += e;
  }
  const float inv = 1.0f / warp_sum(s);
  for (int j = lane; j < T; j += kWarp) a[j] = j <= t ? a[j] * inv : 0.0f;
}

// datt <- att * (datt - <att, datt>) * scale per row, zero above the diagonal.
__global__ void softmax_backward_kernel(float* datt, const float* att, size_t rows, int T, float scale) {
  const size_t row = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  float* d = datt + row * T;
  const float* a = att + row * T;
  float dot = 0;
  for (int j = lane; j <= t; j += kWarp) dot += a[j] * d[j];
  dot = warp_sum(dot);
  for (int j = lane; j < T; j += kWarp) d[j] = j <= t ? a[j] * (d[j] - dot) * scale : 0.0f;
}

}  // namespace zeroth::gpt
