// Small helpers of the block API.
#include "models/block_api.h"

#include <algorithm>  // std::min, std::max

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

std::array<int64_t, 2> TensorSplit::part(int64_t length, int rank, int ranks) {
  const int64_t base = length / ranks, extra = length % ranks;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

std::vector<int64_t> TensorSplit::local_shape(const std::vector<int64_t>& full) const {
  if (axis < 0) return full;
  if (axis >= static_cast<int>(full.size()) || groups < 1 || full[axis] % groups != 0 || rank < 0 || rank >= ranks) {
    ZEROTH_THROW(InvalidArgument, "tensor split: axis {} in {} segments, part {} of {}, of a tensor of {} dimensions (axis length {})",
                 axis, groups, rank, ranks, full.size(), axis < static_cast<int>(full.size()) ? full[axis] : -1);
  }
  const auto [b, e] = part(full[axis] / groups, rank, ranks);
  std::vector<int64_t> out = full;
  out[axis] = groups * (e - b);
  return out;
}

void TensorSplit::for_each_run(size_t lo, size_t hi, const std::function<void(size_t, size_t, size_t)>& f) const {
  if (lo >= hi) return;
  if (!split()) {
    f(lo, hi - lo, lo);
    return;
  }
  // Local element (outer, segment, j, inner) is full element (outer, segment x seg + begin + j, inner).
  size_t inner = 1;
  for (size_t d = axis + 1; d < full_shape.size(); ++d) inner *= static_cast<size_t>(full_shape[d]);
  const size_t seg = static_cast<size_t>(full_shape[axis]) / groups;
  const auto [b, e] = part(static_cast<int64_t>(seg), rank, ranks);
  const size_t run = static_cast<size_t>(e - b) * inner;  // local elements per (outer, segment)
  if (run == 0) return;
  for (size_t r = lo / run; r * run < hi; ++r) {
    const size_t o = r / groups, g = r % groups;
    const size_t full_begin = (o * full_shape[axis] + g * seg + static_cast<size_t>(b)) * inner;
    const size_t a = std::max(lo, r * run), z = std::min(hi, (r + 1) * run);
    f(full_begin + (a - r * run), z - a, a);
  }
}

void TensorSplit::take(const float* full, float* local, size_t count) const {
  for_each_run(0, count, [&](size_t at, size_t n, size_t here) { std::copy(full + at, full + at + n, local + here); });
}

void TensorSplit::put(const float* local, float* full, size_t count) const {
  for_each_run(0, count, [&](size_t at, size_t n, size_t here) { std::copy(local + here, local + here + n, full + at); });
}

ParamSpec ParamSpec::cut(int axis, int groups, int rank, int ranks, bool partial_grad) const {
  ParamSpec out = *this;
  out.tp = {axis, groups, rank, ranks, axis >= 0 ? shape : std::vector<int64_t>{}};
  out.shape = out.tp.local_shape(shape);
  out.tp_partial_grad = partial_grad && ranks > 1;
  return out;
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
