// CUDA runtime queries that degrade to "no GPU" instead of failing.
#include "core/cuda/cuda_info.h"

#ifdef ZEROTH_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <fmt/format.h>

namespace zeroth {

CudaInfo cuda_info() {
  CudaInfo info;
#ifdef ZEROTH_WITH_CUDA
  info.compiled = true;
  cudaRuntimeGetVersion(&info.runtime_version);
  cudaDriverGetVersion(&info.driver_version);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Without a driver (error 35, cudaErrorInsufficientDriver) this is the normal "no GPU" answer.
    info.problem = fmt::format("cudaGetDeviceCount: {} ({})", cudaGetErrorName(err), cudaGetErrorString(err));
    cudaGetLastError();
    return info;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    info.gpus.push_back({i, prop.name, prop.totalGlobalMem, prop.major, prop.minor, prop.multiProcessorCount});
  }
  if (count == 0) info.problem = "the driver reports no CUDA devices";
#else
  info.problem = "zeroth was built without the CUDA backend (-DZEROTH_CUDA=OFF or no nvcc)";
#endif
  return info;
}

int cuda_device_count() {
#ifdef ZEROTH_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

}  // namespace zeroth
