// Where the engine's buffers come from, one allocator per tier: the device (the accelerator, or
// the CPU device standing in for one) and host memory with a budget of its own
// (`run.host_memory`). On the CPU device pinned and pageable host memory are the same memory.
#pragma once

#include <cstddef>  // size_t
#include <map>      // std::map
#include <memory>   // std::unique_ptr

#include "core/device.h"            // Device, Buffer
#include "engine/plan/placement.h"  // Tier

namespace zeroth {

class TierAllocators {
 public:
  TierAllocators(Device& device, size_t host_budget) : device_(device), host_budget_(host_budget) {}
  // Unpins what pinned_host allocations pinned (their buffers must be gone by then).
  ~TierAllocators();
  TierAllocators(const TierAllocators&) = delete;
  TierAllocators& operator=(const TierAllocators&) = delete;

  // OutOfMemory past the tier's budget; InvalidArgument for a tier this device cannot serve.
  Buffer allocate(Tier tier, size_t bytes, MemTag tag);
  // The tier's accounting (what its allocations hold now, at peak, and its budget).
  MemoryStats stats(Tier tier) const;
  size_t budget(Tier tier) const;
  // Bytes of pinned_host allocations the system really page-locked (RLIMIT_MEMLOCK may refuse
  // mlock on the CPU device; those stay pageable, with a warning once).
  size_t pinned_bytes() const;

 private:
  Device& host();

  Device& device_;
  size_t host_budget_;
  std::unique_ptr<Device> host_;    // made on first use
  std::map<void*, size_t> pinned_;  // host blocks page-locked through device_
  bool warned_ = false;
};

}  // namespace zeroth
