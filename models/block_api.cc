// Small helpers of the block API.
#include "models/block_api.h"

#include "core/error.h"  // ZEROTH_THROW

namespace zeroth {

size_t ParamSpec::numel() const {
  size_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) ZEROTH_THROW(ConfigError, "parameter {} has a negative dimension", name);
    n *= static_cast<size_t>(d);
  }
  return n;
}

BlockSchedule default_schedule(size_t blocks) {
  BlockSchedule s;
  for (size_t b = 0; b < blocks; ++b) s.forward.push_back(static_cast<int>(b));
  s.backward.assign(s.forward.rbegin(), s.forward.rend());
  return s;
}

void BlockHost::set_chunk_schedules(std::vector<BlockSchedule> chunks) {
  if (chunks.size() != 1) ZEROTH_THROW(InvalidArgument, "this host runs a model as one chunk, not {}", chunks.size());
  set_schedule(std::move(chunks.front()));
}

}  // namespace zeroth
