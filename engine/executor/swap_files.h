// The rank's swap files: one per buffer the plan puts on the nvme tier, the copy of a two-copy file
// that holds each sub-group's state now, and the bytes, time and first failure of their transfers.
// The executor decides what moves when; this says where it lies in a file and keeps the account.
#pragma once

#include <atomic>      // std::atomic
#include <cstddef>     // size_t
#include <cstdint>     // uint64_t, uint8_t
#include <exception>   // std::exception_ptr
#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <mutex>       // std::mutex
#include <string>      // std::string
#include <vector>      // std::vector

#include "engine/config/config.h"  // EngineConfig
#include "engine/plan/plan.h"      // Plan, OwnedRange
#include "offload/swap_file.h"     // offload::SwapFile

namespace zeroth {

// Bytes the executor moved through swap files so far, and the time its streams spent waiting on
// those transfers (summed over streams, so it can exceed wall time when they overlap).
struct SwapIo {
  uint64_t read_bytes = 0, write_bytes = 0;
  double busy_seconds = 0;
  // Of the bytes, those the optimizer's sub-groups moved (swapped in and out, parameters written
  // back), during the backward pass or after it.
  uint64_t optimizer_read_bytes = 0, optimizer_write_bytes = 0;
};

// The folder of a buffer's swap file: offload_param's for parameters, offload_optimizer's else.
std::string swap_folder(const ZeroConfig& zero, const PlannedBuffer& buffer);

class SwapFiles {
 public:
  // `file_tag` tells apart the files of one process's ranks ("stage1-tp0-" or empty).
  SwapFiles(const Plan& plan, const EngineConfig& config, const std::string& file_tag);

  // The swap file of `buffer`, or null where it is not on the nvme tier.
  offload::SwapFile* file(int buffer) const { return files_[buffer].get(); }
  // Registers host memory with every file's rings; false (after a warning) where the kernel refuses.
  bool register_buffer(void* data, size_t bytes, const std::string& name);

  // Where a sub-group's elements from `lo` (of the offloaded space) are in `buffer`'s file: its
  // current copy, or the other one.
  uint64_t offset(int buffer, int sub_group, size_t lo, bool other_copy = false) const;
  // The other copy of a sub-group's two-copy files becomes the current one.
  void flip(int sub_group) { copy_[sub_group] ^= 1; }
  // The pieces of an owned range of a file as (element offset in the buffer, elements, byte offset
  // in the file): one, or one per sub-group where the file holds two copies.
  struct Piece {
    size_t at, numel;
    uint64_t file_offset;
  };
  std::vector<Piece> pieces(const OwnedRange& r) const;

  // Runs `transfers` (issue and wait) on a host callback's thread, counting bytes and time. After
  // a failed transfer no more is written (the files keep the last good state): the first failure is
  // raised again here, and by check().
  void timed(uint64_t read_bytes, uint64_t write_bytes, const std::function<void()>& transfers, bool optimizer = false);
  void check() const;
  SwapIo io() const;
  // What the file system allocated to the files (st_blocks): their disk use as the kernel counts it.
  uint64_t disk_bytes() const;

 private:
  const Plan& plan_;
  std::vector<std::unique_ptr<offload::SwapFile>> files_;  // as plan.buffers
  std::vector<uint8_t> copy_;                              // per sub-group: 0 or 1
  std::atomic<uint64_t> read_{0}, written_{0}, busy_ns_{0}, optimizer_read_{0}, optimizer_written_{0};
  std::atomic<bool> failed_{false};
  mutable std::mutex error_mutex_;
  std::exception_ptr error_;  // the first failed transfer
};

}  // namespace zeroth
