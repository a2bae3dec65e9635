// RMSNorm (the Llama family), forward and backward.
// Included by cuda_backend.cu, which launches them (one translation unit, as llm.c's llmc/ is).
#pragma once

#include "models/kernels/cuda/cuda_common.cuh"  // kThreads, kWarp, warp and block reductions

namespace zeroth::gpt {

// RMSNorm rows (n, j) of N x groups at n * ld + j * C, one warp per row.
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, const float* w, size_t rows, int groups, int C,
                                       size_t ld, float eps) {
  const size_t r = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const size_t at = r / groups * ld + r % groups * C;
  const float* x = inp + at;
  float s = 0;
  for (int c = lane; c < C; c += kWarp) s += x[c] * x[c];
  const float rs = rsqrtf(warp_sum(s) / C + eps);
  float* y = out + at;
  for (int c = lane; c < C; c += kWarp) y[c] = x[c] * rs * w[c];
  if (lane == 0) rstd[r] = rs;
}

// dinp (+)= rs (w dy - x rs^2 mean(w dy x)), one warp per row.
__global__ void rmsnorm_backward_input_kernel(float* dinp, const float* dout, const float* inp, const float* w, const float* rstd,
                                              size_t rows, int groups, int C, size_t ld, bool accumulate) {
  const size_t r = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const size_t at = r / groups * ld + r % groups * C;
  const float *x = inp + at, *dy = dout + at;
  const float rs = rstd[r];
  float dot = 0;
  for (int c = lane; c < C; c += kWarp) dot += w[c] * dy[c] * x[c];
  const float k = rs * rs * warp_sum(dot) / C;
  float* dx = dinp + at;
  for (int c = lane; c < C; c += kWarp) dx[c] = (accumulate ? dx[c] : 0.0f) + (w[c] * dy[c] - x[c] * k) * rs;
}

// dweight += sum over rows of dy x rstd: one thread per channel, rows in order.
__global__ void rmsnorm_backward_weight_kernel(float* dw, const float* dout, const float* inp, const float* rstd, size_t rows,
                                               int groups, int C, size_t ld) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0;
  for (size_t r = 0; r < rows; ++r) {
    const size_t at = r / groups * ld + r % groups * C + c;
    s += dout[at] * inp[at] * rstd[r];
  }
  dw[c] += s;
}

}  // namespace zeroth::gpt
