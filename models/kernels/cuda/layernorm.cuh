// LayerNorm (GPT-2): forward and backward.
// Included by cuda_backend.cu, which launches them (one translation unit, as llm.c's llmc/ is).
#pragma once

#include "models/kernels/cuda/cuda_common.cuh"  // kThreads, kWarp, warp and block reductions

namespace zeroth::gpt {

// One warp per row.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                                         size_t N, int C) {
  const size_t row = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const float* x = inp + row * C;
  float s = 0;
  for (int c = lane; c < C; c += kWarp) s += x[c];
  const float m = warp_sum(s) / C;
  float v = 0;
  for (int c = lane; c < C; c += kWarp) v += (x[c] - m) * (x[c] - m);
  const float rs = rsqrtf(warp_sum(v) / C + 1e-5f);
  float* y = out + row * C;
  for (int c = lane; c < C; c += kWarp) y[c] = (x[c] - m) * rs * w[c] + b[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

// dinp += ..., one warp per row.
__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp, const float* w, const float* mean,
                                                const float* rstd, size_t N, int C) {
  const size_t row = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  const float m = mean[row], rs = rstd[row];
  float g = 0, gx = 0;
  for (int c = lane; c < C; c += kWarp) {
    const float xhat = (x[c] - m) * rs;
    g += w[c] * dy[c];
    gx += w[c] * dy[c] * xhat;
  }
  const float mean_g = warp_sum(g) / C, mean_gx = warp_sum(gx) / C;
  float* dx = dinp + row * C;
  for (int c = lane; c < C; c += kWarp) {
    const float xhat = (x[c] - m) * rs;
    dx[c] += (w[c] * dy[c] - mean_g - xhat * mean_gx) * rs;
  }
}

// dweight += sum over rows of dy * xhat, dbias += sum of dy: one thread per channel, rows in order.
__global__ void layernorm_backward_params_kernel(float* dw, float* db, const float* dout, const float* inp, const float* mean,
                                                 const float* rstd, size_t N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sw = 0, sb = 0;
  for (size_t r = 0; r < N; ++r) {
    const float dy = dout[r * C + c];
    sw += dy * (inp[r * C + c] - mean[r]) * rstd[r];
    sb += dy;
  }
  dw[c] += sw;
  db[c] += sb;
}

}  // namespace zeroth::gpt
