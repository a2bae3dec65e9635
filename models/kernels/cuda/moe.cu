// The mixture-of-experts row kernels on CUDA: one thread per element moved, one warp per combine
// weight's dot product. Every row is written by one thread and every sum taken in choice order,
// so the results do not depend on scheduling.
#include "models/kernels/cuda/moe.h"

#include "core/cuda/cuda_check.h"               // CUDA_CHECK
#include "models/kernels/cuda/cuda_common.cuh"  // kThreads, kWarp, blocks_for, warp_sum

namespace zeroth::gpt {
namespace {

__global__ void moe_dispatch_kernel(float* out, const float* x, const int32_t* row_token, size_t R, int C) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= R * C) return;
  out[i] = x[static_cast<size_t>(row_token[i / C]) * C + i % C];
}

__global__ void moe_dispatch_backward_kernel(float* dx, const float* drows, const int32_t* row, size_t N, int k, int C) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= N * C) return;
  const size_t n = i / C, c = i % C;
  float sum = dx[i];
  for (int j = 0; j < k; ++j) {
    const int32_t r = row[n * k + j];
    if (r >= 0) sum += drows[static_cast<size_t>(r) * C + c];
  }
  dx[i] = sum;
}

__global__ void moe_combine_kernel(float* y, const float* rows, const int32_t* row, const float* weight, size_t N, int k, int C) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= N * C) return;
  const size_t n = i / C, c = i % C;
  float sum = 0;
  for (int j = 0; j < k; ++j) {
    const int32_t r = row[n * k + j];
    if (r >= 0) sum += weight[n * k + j] * rows[static_cast<size_t>(r) * C + c];
  }
  y[i] = sum;
}

__global__ void moe_combine_rows_grad_kernel(float* drows, const float* dy, const int32_t* row, const float* weight, size_t N, int k,
                                             int C) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= N * k * C) return;
  const size_t choice = i / C, c = i % C;
  const int32_t r = row[choice];
  if (r >= 0) drows[static_cast<size_t>(r) * C + c] = weight[choice] * dy[choice / k * C + c];
}

// One warp per choice: the dot product of the token's gradient with its expert's output row.
__global__ void moe_combine_weight_grad_kernel(float* dweight, const float* dy, const float* rows, const int32_t* row, size_t N, int k,
                                               int C) {
  const size_t choice = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (choice >= N * k) return;
  const int32_t r = row[choice];
  float dot = 0;
  if (r >= 0) {
    const float* g = dy + choice / k * C;
    const float* x = rows + static_cast<size_t>(r) * C;
    for (int c = lane; c < C; c += kWarp) dot += g[c] * x[c];
  }
  dot = warp_sum(dot);
  if (lane == 0) dweight[choice] = dot;
}

}  // namespace

void launch_moe_dispatch(float* out, const float* x, const int32_t* row_token, size_t R, int C, cudaStream_t stream) {
  if (R == 0) return;
  moe_dispatch_kernel<<<blocks_for(R * C), kThreads, 0, stream>>>(out, x, row_token, R, C);
  CUDA_CHECK(cudaGetLastError());
}

void launch_moe_dispatch_backward(float* dx, const float* drows, const int32_t* row, size_t N, int k, int C, cudaStream_t stream) {
  if (N == 0) return;
  moe_dispatch_backward_kernel<<<blocks_for(N * C), kThreads, 0, stream>>>(dx, drows, row, N, k, C);
  CUDA_CHECK(cudaGetLastError());
}

void launch_moe_combine(float* y, const float* rows, const int32_t* row, const float* weight, size_t N, int k, int C,
                        cudaStream_t stream) {
  if (N == 0) return;
  moe_combine_kernel<<<blocks_for(N * C), kThreads, 0, stream>>>(y, rows, row, weight, N, k, C);
  CUDA_CHECK(cudaGetLastError());
}

void launch_moe_combine_backward(float* drows, float* dweight, const float* dy, const float* rows, const int32_t* row,
                                 const float* weight, size_t N, int k, int C, cudaStream_t stream) {
  if (N == 0) return;
  moe_combine_rows_grad_kernel<<<blocks_for(N * k * C), kThreads, 0, stream>>>(drows, dy, row, weight, N, k, C);
  moe_combine_weight_grad_kernel<<<blocks_for(N * k * kWarp), kThreads, 0, stream>>>(dweight, dy, rows, row, N, k, C);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace zeroth::gpt
