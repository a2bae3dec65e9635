// The linear layers' biases: broadcast into the output, summed for the gradient.
// Included by cuda_backend.cu, which launches them (one translation unit, as llm.c's llmc/ is).
#pragma once

#include "models/kernels/cuda/cuda_common.cuh"  // kThreads, kWarp, warp and block reductions

namespace zeroth::gpt {

__global__ void bias_rows_kernel(float* out, const float* bias, int OC, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = bias[i % OC];
}

__global__ void column_sum_kernel(float* dbias, const float* dout, size_t N, int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  float s = 0;
  for (size_t r = 0; r < N; ++r) s += dout[r * OC + c];
  dbias[c] += s;
}

__device__ float gelu_sigmoid(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 1.0f / (1.0f + expf(-2.0f * u));
}

}  // namespace zeroth::gpt
