// GPT-2's GELU (tanh approximation), forward and backward.
// Included by cuda_backend.cu, which launches them (one translation unit, as llm.c's llmc/ is).
#pragma once

#include "models/kernels/cuda/cuda_common.cuh"  // kThreads, kWarp, warp and block reductions

namespace zeroth::gpt {

__global__ void gelu_forward_kernel(float* out, const float* inp, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = inp[i] * gelu_sigmoid(inp[i]);
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = inp[i], s = gelu_sigmoid(x);
  const float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
  dinp[i] = (s + x * 2.0f * s * (1.0f - s) * du) * dout[i];
}

}  // namespace zeroth::gpt
