#include "offload/aligned_buffer.h"

#include <cstdlib>  // std::aligned_alloc, std::free

#include "core/error.h"  // ZEROTH_CHECK, ZEROTH_THROW

namespace zeroth::offload {

AlignedBuffer::AlignedBuffer(std::size_t bytes, std::size_t alignment) {
  ZEROTH_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0 && alignment % sizeof(void*) == 0,
               "AlignedBuffer: alignment {} must be a power of two and a multiple of {}", alignment, sizeof(void*));
  if (bytes == 0) return;
  // aligned_alloc requires the size to be a multiple of the alignment.
  size_ = (bytes + alignment - 1) / alignment * alignment;
  data_.reset(static_cast<std::byte*>(std::aligned_alloc(alignment, size_)));
  if (data_ == nullptr) ZEROTH_THROW(OutOfMemory, "std::aligned_alloc({}, {}) failed for a host I/O buffer", alignment, size_);
}

void AlignedBuffer::Free::operator()(std::byte* p) const { std::free(p); }

}  // namespace zeroth::offload
