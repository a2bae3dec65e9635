// The token and position embedding: forward and the embeddings' gradients.
// Included by cuda_backend.cu, which launches them (one translation unit, as llm.c's llmc/ is).
#pragma once

#include "models/kernels/cuda/cuda_common.cuh"  // kThreads, kWarp, warp and block reductions

namespace zeroth::gpt {

// wte holds vocabulary rows [v_lo, v_lo + V): other tokens add 0; wpe may be null.
__global__ void encoder_forward_kernel(float* out, const int32_t* tokens, const float* wte, const float* wpe, int T, int C, int v_lo,
                                       int V, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const size_t row = i / C, c = i % C;
  const int t = tokens[row] - v_lo;
  const float e = t >= 0 && t < V ? wte[static_cast<size_t>(t) * C + c] : 0.0f;
  out[i] = wpe != nullptr ? e + wpe[(row % T) * C + c] : e;
}

// One block per row n; the first row holding a token adds the rows of that token in row order,
// so repeated tokens sum deterministically (no atomics).
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int32_t* tokens, int C, int rows, int v_lo, int V) {
  const int n = blockIdx.x;
  const int tok = tokens[n];
  if (tok < v_lo || tok >= v_lo + V) return;
  int earlier = 0;
  for (int m = threadIdx.x; m < n; m += blockDim.x) earlier |= tokens[m] == tok;
  if (__syncthreads_or(earlier)) return;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0;
    for (int m = n; m < rows; ++m) {
      if (tokens[m] == tok) acc += dout[static_cast<size_t>(m) * C + c];
    }
    dwte[static_cast<size_t>(tok - v_lo) * C + c] += acc;
  }
}

__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<size_t>(T) * C) return;
  float s = 0;
  for (int b = 0; b < B; ++b) s += dout[static_cast<size_t>(b) * T * C + i];
  dwpe[i] += s;
}

}  // namespace zeroth::gpt
