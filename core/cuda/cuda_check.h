// CUDA_CHECK: a failed CUDA runtime call raises CudaError with the call, its error and location.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error_types.h"

#define CUDA_CHECK(call)                                                                                                           \
  do {                                                                                                                             \
    const cudaError_t zeroth_cuda_err_ = (call);                                                                                   \
    if (zeroth_cuda_err_ != cudaSuccess) [[unlikely]] {                                                                            \
      throw ::zeroth::CudaError(std::string(#call) + " failed: " + cudaGetErrorName(zeroth_cuda_err_) + " (" +                     \
                                cudaGetErrorString(zeroth_cuda_err_) + ") [" + ::zeroth::detail::where(__FILE__, __LINE__) + "]"); \
    }                                                                                                                              \
  } while (0)
