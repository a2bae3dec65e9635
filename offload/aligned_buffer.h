// Page-aligned host memory for O_DIRECT transfers: one owning allocation, freed on destruction.
#pragma once

#include <cstddef>  // std::byte, std::size_t
#include <memory>   // std::unique_ptr

namespace zeroth::offload {

// O_DIRECT wants buffer address, file offset and length on the device's logical block; 4 KiB
// covers every NVMe and page-cache case zeroth meets.
inline constexpr std::size_t kIoAlignment = 4096;
inline constexpr std::size_t round_up_to_io(std::size_t bytes) { return (bytes + kIoAlignment - 1) / kIoAlignment * kIoAlignment; }
// Buffers of at least this size start on a huge-page boundary and ask for huge pages.
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // `bytes` is rounded up to a multiple of `alignment` (a power of two, at least 4 KiB is usual);
  // the memory is not cleared. From kHugePageBytes on, the buffer is aligned to that and backed
  // by transparent huge pages where the kernel has them (MADV_HUGEPAGE).
  explicit AlignedBuffer(std::size_t bytes, std::size_t alignment = kIoAlignment);

  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  // The usable size: the request rounded up to the alignment.
  std::size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t size_ = 0;
};

}  // namespace zeroth::offload
