// The GPU side of `zeroth bench offload`: host<->device copy rates from pinned and pageable
// host memory, the last hop of a swap from NVMe to the GPU.
#pragma once

#include <cstddef>  // std::size_t
#include <string>   // std::string

namespace zeroth::tools {

struct CopyRates {
  std::size_t bytes = 0;
  std::string gpu;
  double h2d_pinned = 0, d2h_pinned = 0, h2d_pageable = 0, d2h_pageable = 0;  // GB/s
};

// Raises an error saying why `device` ("cuda" or "cuda:N") cannot be used: a build without the
// CUDA backend, no driver, no such GPU.
void check_cuda_device(const std::string& device);

// cudaMemcpyAsync of `bytes` each way, from cudaHostAlloc memory and from ordinary (pageable)
// memory, median of `reps` after a warm-up copy.
CopyRates measure_cuda_copies(const std::string& device, std::size_t bytes, int reps);

}  // namespace zeroth::tools
