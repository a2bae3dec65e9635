// A block of columns added from one row-major matrix into another (Kernels::copy_columns with add;
// the plain copy is cudaMemcpy2DAsync). Included by cuda_backend.cu, which launches it.
#pragma once

#include "models/kernels/cuda/cuda_common.cuh"  // kThreads

namespace zeroth::gpt {

__global__ void add_columns_kernel(float* dst, size_t ldd, const float* src, size_t lds, size_t rows, size_t cols) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  const size_t r = i / cols, c = i % cols;
  dst[r * ldd + c] += src[r * lds + c];
}

}  // namespace zeroth::gpt
