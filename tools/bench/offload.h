// The parts of `zeroth bench offload` beside the raw sweep: the engine's optimizer swapper end
// to end, and (GPU) host<->device copy rates from pinned and pageable host memory, the last hop
// of a swap from NVMe to the GPU.
#pragma once

#include <cstddef>  // std::size_t
#include <cstdint>  // uint64_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string

namespace zeroth::tools {

struct CopyRates {
  std::size_t bytes = 0;
  std::string gpu;
  double h2d_pinned = 0, d2h_pinned = 0, h2d_pageable = 0, d2h_pageable = 0;  // GB/s
};

struct SwapperSetting {
  std::size_t block_size = std::size_t{1} << 20;
  unsigned queue_depth = 32, threads = 1;
  uint64_t sub_group_size = 25'000'000;  // elements
};

// The engine training an MLP of about `state_bytes` of swapped state (stage 3, optimizer state
// and parameters in swap files in `folder`, bf16, AdamW), its first step run (it reads extents
// never written, which a file system answers without the disk).
class SwapperBench {
 public:
  SwapperBench(const std::string& folder, std::size_t state_bytes, const SwapperSetting& setting);
  ~SwapperBench();
  SwapperBench(const SwapperBench&) = delete;
  SwapperBench& operator=(const SwapperBench&) = delete;

  // One more step; the seconds from the end of its gradient reductions until the last
  // write-back reached its file, in which it read read_bytes() and wrote write_bytes().
  double step();
  uint64_t params() const;
  uint64_t padded_params() const;  // what the swap files hold: blocks padded to the files' 4 KiB
  std::size_t sub_groups() const;
  uint64_t read_bytes() const { return read_bytes_; }
  uint64_t write_bytes() const { return write_bytes_; }
  // What rates of `read_gbps` and `write_gbps` give for those bytes, one direction after the
  // other (the ceiling when the disk reads and writes at once no faster than either alone).
  double ceiling_gbps(double read_gbps, double write_gbps) const {
    const double r = static_cast<double>(read_bytes_) * 1e-9, w = static_cast<double>(write_bytes_) * 1e-9;
    return (r + w) / (r / read_gbps + w / write_gbps);
  }

 private:
  struct State;
  std::unique_ptr<State> state_;
  uint64_t read_bytes_ = 0, write_bytes_ = 0;
};

// Writing then reading `bytes` of a fresh file in `folder` through the engine's AsyncFile at
// `setting` (requests of block x depth x threads, two in flight), after a first pass that
// allocates the file's blocks: GB/s each way, the disk's rate the engine's own swaps can reach.
// With `fresh_file`, the write is the file's first, fsync'd before the clock stops: as a checkpoint's.
struct RawRates {
  double write_gbps = 0, read_gbps = 0;
};
RawRates measure_raw_rates(const std::string& folder, std::size_t bytes, const SwapperSetting& setting, bool fresh_file = false);

// Raises an error saying why `device` ("cuda" or "cuda:N") cannot be used: a build without the
// CUDA backend, no driver, no such GPU.
void check_cuda_device(const std::string& device);

// cudaMemcpyAsync of `bytes` each way, from cudaHostAlloc memory and from ordinary (pageable)
// memory, median of `reps` after a warm-up copy.
CopyRates measure_cuda_copies(const std::string& device, std::size_t bytes, int reps);

}  // namespace zeroth::tools
