// Cross-entropy over a vocabulary slice, its gradient, and the loss's mean.
// Included by cuda_backend.cu, which launches them (one translation unit, as llm.c's llmc/ is).
#pragma once

#include "models/kernels/cuda/cuda_common.cuh"  // kThreads, kWarp, warp and block reductions

namespace zeroth::gpt {

// Cross-entropy in three steps over the vocabulary slice [v_lo, v_lo + V) (kernels.h), one block
// per row; stats = [max | sum of exp | target logit], N each; the row losses apart.
__global__ void crossentropy_max_kernel(const float* logits, float* stats, int V) {
  const size_t row = blockIdx.x;
  const float* x = logits + row * V;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, x[j]);
  m = block_reduce(m, Max{}, -INFINITY);
  if (threadIdx.x == 0) stats[row] = m;
}

__global__ void crossentropy_sums_kernel(float* logits, const int32_t* targets, float* stats, size_t N, int V, int v_lo) {
  const size_t row = blockIdx.x;
  float* x = logits + row * V;
  const int t = targets[row] - v_lo;
  const float m = stats[row];
  const float picked = t >= 0 && t < V ? x[t] : 0.0f;
  __syncthreads();  // every thread has read x[t] before it becomes exp(x[t] - m)
  float s = 0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float e = expf(x[j] - m);
    x[j] = e;
    s += e;
  }
  s = block_reduce(s, Sum{}, 0.0f);
  if (threadIdx.x == 0) {
    stats[N + row] = s;
    stats[2 * N + row] = picked;
  }
}

__global__ void crossentropy_finish_kernel(float* logits, const int32_t* targets, const float* stats, float* losses, size_t N, int V,
                                           int v_lo, float dscale) {
  const size_t row = blockIdx.x;
  const float s = stats[N + row];
  const bool ignored = targets[row] < 0;  // the loss mask: no loss, no gradient
  if (threadIdx.x == 0) losses[row] = ignored ? 0.0f : logf(s) + stats[row] - stats[2 * N + row];
  if (dscale == 0.0f) return;
  float* x = logits + row * V;
  const int t = targets[row] - v_lo;
  const float a = ignored ? 0.0f : dscale / s;
  for (int j = threadIdx.x; j < V; j += blockDim.x) x[j] = x[j] * a - (j == t ? dscale : 0.0f);
}

// The finish's gradient from the logits as the product left them: the sums kernel's exp, then the
// finish's scaling.
__global__ void crossentropy_gradient_kernel(float* logits, const int32_t* targets, const float* stats, size_t N, int V, int v_lo,
                                             float dscale) {
  const size_t row = blockIdx.x;
  float* x = logits + row * V;
  const int t = targets[row] - v_lo;
  const float m = stats[row], a = targets[row] < 0 ? 0.0f : dscale / stats[N + row];
  for (int j = threadIdx.x; j < V; j += blockDim.x) x[j] = expf(x[j] - m) * a - (j == t ? dscale : 0.0f);
}

// out[0] = sum(in[0..n)) / divisor, one block, in a fixed order.
__global__ void mean_kernel(float* out, const float* in, size_t n, float divisor) {
  float s = 0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += in[i];
  s = block_reduce(s, Sum{}, 0.0f);
  if (threadIdx.x == 0) out[0] = s / divisor;
}

}  // namespace zeroth::gpt
