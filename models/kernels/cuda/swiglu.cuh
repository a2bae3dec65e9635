// SwiGLU (the Llama family's MLP activation), forward and backward.
// Included by cuda_backend.cu, which launches them (one translation unit, as llm.c's llmc/ is).
#pragma once

#include "models/kernels/cuda/cuda_common.cuh"  // kThreads, kWarp, warp and block reductions

namespace zeroth::gpt {

__global__ void swiglu_forward_kernel(float* out, const float* inp, size_t N, int F) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= N * F) return;
  const size_t n = i / F, j = i % F;
  const float gate = inp[n * 2 * F + j];
  out[i] = gate / (1.0f + expf(-gate)) * inp[n * 2 * F + F + j];
}

__global__ void swiglu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t N, int F) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= N * F) return;
  const size_t n = i / F, j = i % F;
  const float gate = inp[n * 2 * F + j], up = inp[n * 2 * F + F + j];
  const float sig = 1.0f / (1.0f + expf(-gate));
  dinp[n * 2 * F + j] = dout[i] * up * sig * (1.0f + gate * (1.0f - sig));
  dinp[n * 2 * F + F + j] = dout[i] * gate * sig;
}

}  // namespace zeroth::gpt
