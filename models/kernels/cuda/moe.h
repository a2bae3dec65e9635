// The mixture-of-experts row kernels on CUDA (semantics: cpu/row_kernels.h), launched on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>  // size_t
#include <cstdint>  // int32_t

namespace zeroth::gpt {

void launch_moe_dispatch(float* out, const float* x, const int32_t* row_token, size_t R, int C, cudaStream_t stream);
void launch_moe_dispatch_backward(float* dx, const float* drows, const int32_t* row, size_t N, int k, int C, cudaStream_t stream);
void launch_moe_combine(float* y, const float* rows, const int32_t* row, const float* weight, size_t N, int k, int C,
                        cudaStream_t stream);
void launch_moe_combine_backward(float* drows, float* dweight, const float* dy, const float* rows, const int32_t* row,
                                 const float* weight, size_t N, int k, int C, cudaStream_t stream);

}  // namespace zeroth::gpt
