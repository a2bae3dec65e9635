#include "offload/aligned_buffer.h"

#include <sys/mman.h>  // madvise

#include <algorithm>  // std::max
#include <cstdlib>    // std::aligned_alloc, std::free

#include "core/error.h"  // ZEROTH_CHECK, ZEROTH_THROW

namespace zeroth::offload {

AlignedBuffer::AlignedBuffer(std::size_t bytes, std::size_t alignment) {
  ZEROTH_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0 && alignment % sizeof(void*) == 0,
               "AlignedBuffer: alignment {} must be a power of two and a multiple of {}", alignment, sizeof(void*));
  if (bytes == 0) return;
  // aligned_alloc requires the size to be a multiple of the alignment.
  size_ = (bytes + alignment - 1) / alignment * alignment;
  // In 4 KiB pages a 1 MiB transfer is 256 scattered pages: the kernel pins each one and the
  // device gets up to 256 segments (virtio-blk takes 254 per request, so the transfer is split).
  // In 2 MiB pages it is one segment. Large buffers ask for them; where transparent huge pages
  // are off, madvise fails and the buffer keeps 4 KiB pages.
  const bool huge = size_ >= kHugePageBytes;
  const std::size_t align = huge ? std::max(alignment, kHugePageBytes) : alignment;
  const std::size_t capacity = (size_ + align - 1) / align * align;
  data_.reset(static_cast<std::byte*>(std::aligned_alloc(align, capacity)));
  if (data_ == nullptr) ZEROTH_THROW(OutOfMemory, "std::aligned_alloc({}, {}) failed for a host I/O buffer", align, capacity);
  if (huge) ::madvise(data_.get(), capacity, MADV_HUGEPAGE);
}

void AlignedBuffer::Free::operator()(std::byte* p) const { std::free(p); }

}  // namespace zeroth::offload
