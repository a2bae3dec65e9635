// The tier allocators.
#include "engine/executor/tier_allocators.h"

#include <sys/resource.h>  // getrlimit

#include <string>  // std::string

#include "core/error.h"  // ZEROTH_THROW
#include "core/log.h"    // ZLOG_WARN

namespace zeroth {

Device& TierAllocators::host() {
  if (!host_) host_ = make_device("cpu", {.memory_budget = host_budget_});
  return *host_;
}

Buffer TierAllocators::allocate(Tier tier, size_t bytes, MemTag tag) {
  switch (tier) {
    case Tier::device: return device_.allocate(bytes, tag);
    case Tier::pinned_host: {
      Buffer b = host().allocate(bytes, tag);
      // The host cache may hand back a block pinned before; pin only what is new.
      auto it = pinned_.find(b.data());
      if (it != pinned_.end() && it->second >= bytes) return b;
      if (it != pinned_.end()) {
        device_.unpin_host(it->first, it->second);
        pinned_.erase(it);
      }
      if (device_.pin_host(b.data(), bytes)) {
        pinned_[b.data()] = bytes;
      } else if (!warned_) {
        warned_ = true;
        rlimit limit{};
        getrlimit(RLIMIT_MEMLOCK, &limit);
        ZLOG_WARN("pin_memory: the system refused to page-lock {} of host memory (RLIMIT_MEMLOCK is {}); those buffers stay pageable. "
                  "Raise the limit (ulimit -l) to pin them",
                  format_bytes(bytes), limit.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : format_bytes(limit.rlim_cur));
      }
      return b;
    }
    case Tier::host: return host().allocate(bytes, tag);
    case Tier::nvme: break;
  }
  ZEROTH_THROW(InvalidArgument, "the {} tier has no allocator in this build: no plan places state there yet", tier_name(tier));
}

TierAllocators::~TierAllocators() {
  for (const auto& [data, bytes] : pinned_) device_.unpin_host(data, bytes);
}

size_t TierAllocators::pinned_bytes() const {
  size_t n = 0;
  for (const auto& [data, bytes] : pinned_) n += bytes;
  return n;
}

MemoryStats TierAllocators::stats(Tier tier) const {
  if (tier == Tier::device) return device_.memory().stats();
  if ((tier == Tier::host || tier == Tier::pinned_host) && host_) return host_->memory().stats();
  MemoryStats none;
  none.budget = budget(tier);
  return none;
}

size_t TierAllocators::budget(Tier tier) const {
  if (tier == Tier::device) return device_.memory().budget();
  return tier == Tier::nvme ? 0 : host_budget_;
}

}  // namespace zeroth
