// An arena of the plan (the gathered parameters', the transient gradients'): the program places
// each block's region at an offset the planner chose, and a released region is overwritten only
// once the last work that read it is done, so reuse costs an event, not a synchronization.
// See [Note: release events] in docs/ARCHITECTURE.md.
#pragma once

#include <cstddef>  // size_t
#include <memory>   // std::shared_ptr
#include <vector>   // std::vector

#include "core/device.h"  // Stream, Event

namespace zeroth {

class Arena {
 public:
  Arena() = default;
  // `base`: the arena's buffer (null where the plan has none); offsets count elements of
  // `element_bytes`.
  Arena(void* base, size_t element_bytes) : base_(static_cast<char*>(base)), element_bytes_(element_bytes) {}

  // Elements [offset, offset + length): `writer` waits for the released regions they overlap, and
  // those they cover are forgotten. Returns where they are.
  void* place(size_t offset, size_t length, Stream& writer);
  // The region that place() returned `at` for is free once `done` has happened.
  void release(const void* at, size_t length, std::shared_ptr<Event> done);

 private:
  struct Released {
    size_t offset, length;
    std::shared_ptr<Event> done;
  };
  char* base_ = nullptr;
  size_t element_bytes_ = 0;
  std::vector<Released> released_;
};

}  // namespace zeroth
