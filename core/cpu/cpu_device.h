// The CPU device: host memory standing in for an accelerator, with a budget, a caching
// pre-touched allocator, thread-backed streams and the SIMD/oneTBB kernels.
#pragma once

#include <map>     // std::multimap
#include <memory>  // std::unique_ptr
#include <mutex>   // std::mutex

#include "core/cpu/cpu_stream.h"
#include "core/device.h"

namespace zeroth {

// Blocks are kept after free and handed out again for the same rounded size, so a training step
// that allocates what the previous one freed never pays the first touch of fresh pages (seconds
// per GiB on virtual machines). New blocks are touched once, when allocated.
//
// Large blocks start at a varying multiple of 2 MiB past a huge-page boundary ("colors"): arrays
// whose starts are a large power-of-two multiple apart collide (by all appearances in TLB or
// cache sets) when streamed together, which cut a five-array optimizer step from 1.7 to
// 1.0 G params/s here.
class HostBlockCache {
 public:
  ~HostBlockCache();
  void* allocate(size_t bytes);
  void free(void* data, size_t bytes);
  void release_all();
  size_t reserved_bytes() const;
  size_t cached_bytes() const;

 private:
  struct Mapping {
    void* base;
    size_t length;
  };
  static size_t rounded(size_t bytes);
  void* map_block(size_t size);
  void unmap_block(void* data, size_t size);

  mutable std::mutex mutex_;
  std::multimap<size_t, void*> free_blocks_;  // rounded size -> block
  std::map<void*, Mapping> mappings_;         // large block -> the mapping it lives in
  unsigned color_ = 0;
  size_t reserved_ = 0;
  size_t cached_ = 0;
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(size_t memory_budget = 0);
  ~CpuDevice() override;

  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string name() const override { return "cpu"; }
  std::unique_ptr<Stream> create_stream() override;
  std::unique_ptr<Event> create_event() override;
  Stream& default_stream() override { return *default_stream_; }
  void synchronize() override;
  void release_cached_memory() override { cache_.release_all(); }
  size_t reserved_bytes() const { return cache_.reserved_bytes(); }

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_free(void* data, size_t bytes) override { cache_.free(data, bytes); }

  void do_fill(Stream& stream, TensorView dst, float value) override;
  void do_copy(Stream& stream, void* dst, const void* src, size_t bytes) override;
  void do_cast(Stream& stream, TensorView dst, TensorView src) override;
  void do_scale(Stream& stream, TensorView x, float alpha) override;
  void do_axpy(Stream& stream, TensorView y, float alpha, TensorView x) override;
  void do_sum_squares(Stream& stream, TensorView x, float* out, bool accumulate) override;
  void do_flag_nonfinite(Stream& stream, TensorView x, int32_t* flag) override;
  void do_reduce(Stream& stream, TensorView out, std::span<const TensorView> inputs, ReduceKind kind, float scale) override;

 private:
  static CpuStream& cpu_stream(Stream& stream);

  HostBlockCache cache_;
  StreamRegistry streams_;
  std::unique_ptr<CpuStream> default_stream_;
};

}  // namespace zeroth
