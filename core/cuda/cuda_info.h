// What the CUDA runtime reports about this machine; never throws (for `zeroth report`).
#pragma once

#include <cstddef>  // size_t
#include <string>   // std::string
#include <vector>   // std::vector

namespace zeroth {

struct GpuInfo {
  int index = 0;
  std::string name;
  size_t total_memory = 0;
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
};

struct CudaInfo {
  bool compiled = false;    // zeroth built with the CUDA backend
  int runtime_version = 0;  // e.g. 13000
  int driver_version = 0;   // 0 when no driver is loaded
  std::string problem;      // why no GPU can be used, when none can
  std::vector<GpuInfo> gpus;
};

CudaInfo cuda_info();
// Number of usable GPUs: 0 without the backend, a driver or a device.
int cuda_device_count();

}  // namespace zeroth
