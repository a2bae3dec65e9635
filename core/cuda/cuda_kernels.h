// Launchers of the CUDA element-wise kernels (cuda_kernels.cu); plain C++ so host code can call
// them without nvcc.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>  // size_t
#include <cstdint>  // int32_t

#include "core/dtype.h"

namespace zeroth::cuda {

void launch_fill(void* dst, DType type, float value, size_t n, cudaStream_t stream);
void launch_cast(const void* src, DType src_type, void* dst, DType dst_type, size_t n, cudaStream_t stream);
void launch_scale(void* x, DType type, float alpha, size_t n, cudaStream_t stream);
void launch_axpy(void* y, DType y_type, float alpha, const void* x, DType x_type, size_t n, cudaStream_t stream);
// Two passes through a stream-ordered scratch allocation: deterministic for a given n.
void launch_sum_squares(const void* x, DType type, size_t n, float* out, bool accumulate, cudaStream_t stream);
// out = scale * sum(inputs) or the element-wise max, f32 accumulation in input order.
void launch_reduce(const void* const* inputs, int k, DType in_type, void* out, DType out_type, bool max, float scale, size_t n,
                   cudaStream_t stream);
void launch_flag_nonfinite(const void* x, DType type, size_t n, int32_t* flag, cudaStream_t stream);

}  // namespace zeroth::cuda
