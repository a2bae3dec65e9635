// The staging of a checkpoint's data files, apart from the format so that the memory estimate
// (engine/plan/estimate.cc) counts it without depending on the checkpoint code, which depends on
// the plan.
#pragma once

#include <cstddef>  // size_t

#include "offload/aligned_buffer.h"  // offload::kIoAlignment

namespace zeroth::ckpt {

// Each of the staging buffers a data file streams through (kWriteBuffers of them for a save, one
// written while the other fills; kStreamBuffers for a load, read ahead while one is hashed and
// copied out): large enough for several of the file's blocks in flight, small enough that
// touching them for the first time (slow on these machines) costs little per save or load. Data
// goes through them in whole O_DIRECT blocks.
inline constexpr size_t kStagingBytes = size_t{8} << 20;
inline constexpr size_t kStagingAlignment = offload::kIoAlignment;
inline constexpr int kWriteBuffers = 2;
inline constexpr int kStreamBuffers = 4;

}  // namespace zeroth::ckpt
