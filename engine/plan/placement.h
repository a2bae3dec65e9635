// Memory tiers: where a byte of the engine's state lives. The device is the accelerator (or the
// CPU device standing in for one); pinned and pageable host memory and NVMe files hold what is
// offloaded. Plans count bytes per tier and tag, and every "does it fit?" reads those counts.
#pragma once

#include <array>        // std::array
#include <cstddef>      // size_t
#include <cstdint>      // uint8_t
#include <string_view>  // std::string_view

#include "core/memory.h"  // kMemTagCount

namespace zeroth {

enum class Tier : uint8_t { device = 0, pinned_host, host, nvme };
inline constexpr size_t kTierCount = 4;
std::string_view tier_name(Tier tier);

// Bytes per tier and tag: bytes[tier][tag].
using TierBytes = std::array<std::array<size_t, kMemTagCount>, kTierCount>;

inline size_t& at(TierBytes& b, Tier tier, MemTag tag) { return b[static_cast<size_t>(tier)][static_cast<size_t>(tag)]; }
inline size_t at(const TierBytes& b, Tier tier, MemTag tag) { return b[static_cast<size_t>(tier)][static_cast<size_t>(tag)]; }
size_t tier_total(const TierBytes& b, Tier tier);

}  // namespace zeroth
