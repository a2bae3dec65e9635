// The tier allocators.
#include "engine/tiers.h"

#include "core/error.h"  // ZEROTH_THROW

namespace zeroth {

Device& TierAllocators::host() {
  if (!host_) host_ = make_device("cpu", {.memory_budget = host_budget_});
  return *host_;
}

Buffer TierAllocators::allocate(Tier tier, size_t bytes, MemTag tag) {
  switch (tier) {
    case Tier::device: return device_.allocate(bytes, tag);
    case Tier::pinned_host:
      if (device_.kind() != DeviceKind::cpu) {
        ZEROTH_THROW(InvalidArgument, "pinned host memory for {} is not available in this build: no plan places state there yet",
                     device_.name());
      }
      return host().allocate(bytes, tag);
    case Tier::host: return host().allocate(bytes, tag);
    case Tier::nvme: break;
  }
  ZEROTH_THROW(InvalidArgument, "the {} tier has no allocator in this build: no plan places state there yet", tier_name(tier));
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
