// Page-aligned host memory for O_DIRECT transfers: one owning allocation, freed on destruction.
#pragma once

#include <cstddef>  // std::byte, std::size_t
#include <memory>   // std::unique_ptr

namespace zeroth::offload {

// O_DIRECT wants buffer address, file offset and length on the device's logical block; 4 KiB
// covers every NVMe and page-cache case zeroth meets.
inline constexpr std::size_t kIoAlignment = 4096;

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // `bytes` is rounded up to a multiple of `alignment` (a power of two, at least 4 KiB is usual);
  // the memory is not cleared.
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
