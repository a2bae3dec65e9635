#include "tools/bench/offload.h"

#ifdef ZEROTH_WITH_CUDA
#include <cuda_runtime_api.h>  // cudaHostAlloc, cudaMemcpyAsync

#include "core/cuda/cuda_check.h"  // CUDA_CHECK
#endif

#include <chrono>   // std::chrono::steady_clock
#include <cstring>  // std::memset
#include <vector>   // std::vector

#include "core/cuda/cuda_info.h"     // cuda_info
#include "core/error.h"              // ZEROTH_CHECK, ZEROTH_THROW
#include "core/stats.h"              // median
#include "offload/aligned_buffer.h"  // AlignedBuffer

namespace zeroth::tools {
namespace {

int device_index(const std::string& device) {
  if (device == "cuda") return 0;
  const std::string digits = device.substr(device.find(':') + 1);
  ZEROTH_CHECK(device.rfind("cuda:", 0) == 0 && !digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos,
               "--device {}: use cuda or cuda:N", device);
  return std::stoi(digits);
}

}  // namespace

void check_cuda_device(const std::string& device) {
  const int index = device_index(device);
  const CudaInfo info = cuda_info();
  if (!info.compiled) {
    ZEROTH_THROW(InvalidArgument,
                 "--device {}: this zeroth was built without the CUDA backend; rebuild with -DZEROTH_CUDA=ON on a machine with the "
                 "CUDA toolkit, or use --device cpu",
                 device);
  }
  if (info.gpus.empty()) ZEROTH_THROW(CudaError, "--device {}: no usable GPU here ({}); use --device cpu", device, info.problem);
  if (index >= static_cast<int>(info.gpus.size())) {
    ZEROTH_THROW(InvalidArgument, "--device {}: this machine has {} GPU(s), numbered from 0", device, info.gpus.size());
  }
}

#ifdef ZEROTH_WITH_CUDA

namespace {

// The allocations and the stream of one measurement, returned on every way out.
struct CudaResources {
  void* device = nullptr;
  void* pinned = nullptr;
  cudaStream_t stream = nullptr;
  ~CudaResources() {
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (pinned != nullptr) cudaFreeHost(pinned);
    if (device != nullptr) cudaFree(device);
  }
};

}  // namespace

CopyRates measure_cuda_copies(const std::string& device, std::size_t bytes, int reps) {
  check_cuda_device(device);
  const int index = device_index(device);
  CUDA_CHECK(cudaSetDevice(index));
  CopyRates rates;
  rates.bytes = bytes;
  rates.gpu = cuda_info().gpus[static_cast<std::size_t>(index)].name;
  CudaResources r;
  CUDA_CHECK(cudaMalloc(&r.device, bytes));
  CUDA_CHECK(cudaHostAlloc(&r.pinned, bytes, cudaHostAllocDefault));
  CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  offload::AlignedBuffer pageable(bytes);
  // Touched first: the first write of fresh pages costs more than the copy.
  std::memset(pageable.data(), 1, bytes);
  std::memset(r.pinned, 1, bytes);
  CUDA_CHECK(cudaMemsetAsync(r.device, 2, bytes, r.stream));
  auto rate = [&](void* dst, const void* src, cudaMemcpyKind kind) {
    std::vector<double> gbps;
    for (int rep = -1; rep < reps; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, r.stream));
      CUDA_CHECK(cudaStreamSynchronize(r.stream));
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep >= 0) gbps.push_back(bytes / seconds / 1e9);
    }
    return median(gbps);
  };
  rates.h2d_pinned = rate(r.device, r.pinned, cudaMemcpyHostToDevice);
  rates.d2h_pinned = rate(r.pinned, r.device, cudaMemcpyDeviceToHost);
  rates.h2d_pageable = rate(r.device, pageable.data(), cudaMemcpyHostToDevice);
  rates.d2h_pageable = rate(pageable.data(), r.device, cudaMemcpyDeviceToHost);
  return rates;
}

#else

CopyRates measure_cuda_copies(const std::string& device, std::size_t, int) {
  check_cuda_device(device);  // raises: this build has no CUDA backend
  return {};
}

#endif

}  // namespace zeroth::tools
