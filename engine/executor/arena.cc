#include "engine/executor/arena.h"

#include <utility>  // std::move

namespace zeroth {

// See [Note: release events] in docs/ARCHITECTURE.md.
void* Arena::place(size_t offset, size_t length, Stream& writer) {
  // The region's previous tenants must be done with it before the writer overwrites it.
  std::erase_if(released_, [&](const Released& r) {
    if (r.offset >= offset + length || offset >= r.offset + r.length) return false;
    writer.wait(*r.done);
    return r.offset >= offset && r.offset + r.length <= offset + length;
  });
  return base_ + offset * element_bytes_;
}

void Arena::release(const void* at, size_t length, std::shared_ptr<Event> done) {
  const size_t offset = static_cast<size_t>(static_cast<const char*>(at) - base_) / element_bytes_;
  released_.push_back({offset, length, std::move(done)});
}

}  // namespace zeroth
