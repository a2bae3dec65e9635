// The plan's parts that concern the other groups of a rank: its tensor-parallel ranges (which
// gradients count in the norm here, which are partial sums over the group) and their use by the
// norm, which also leaves out a pipeline's uncounted tied copy.
#include <algorithm>  // std::max

#include "core/error.h"  // ZEROTH_THROW
#include "engine/plan/plan.h"

namespace zeroth {

void plan_tensor_parallel(Plan& p, PlannedBlock& blk, const BlockSpec& spec) {
  // Replicated parameters count in the norm on tensor-parallel rank 0; partial gradients are
  // summed over the group. Neighbours merge (the alignment gaps between them hold zeros).
  auto ranges = [&](auto&& pick) {
    std::vector<std::array<size_t, 2>> out;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      if (!pick(spec.params[i])) continue;
      const size_t lo = blk.param_offsets[i], hi = lo + spec.params[i].numel();
      if (!out.empty() && i > 0 && out.back()[1] == blk.param_offsets[i - 1] + spec.params[i - 1].numel() && pick(spec.params[i - 1]))
        out.back()[1] = hi;
      else out.push_back({lo, hi});
    }
    return out;
  };
  blk.norm_excluded = ranges([](const ParamSpec& q) { return q.tp.replicated() && q.tp.rank != 0; });
  blk.tp_partial = ranges([](const ParamSpec& q) { return q.tp_partial_grad; });
  for (const auto& param : spec.params) {
    if (param.tp.replicated()) p.tp_replicated += param.numel();
    if (param.tp.ranks <= 1) continue;
    if (p.tp > 1 && (param.tp.ranks != p.tp || param.tp.rank != p.tp_rank)) {
      ZEROTH_THROW(InvalidArgument, "parameter {}.{} is split for rank {} of {}, another for rank {} of {}: one tensor-parallel group",
                   spec.name, param.name, param.tp.rank, param.tp.ranks, p.tp_rank, p.tp);
    }
    p.tp = param.tp.ranks, p.tp_rank = param.tp.rank;
  }
}

std::vector<std::array<size_t, 2>> Plan::counted_in_norm(int block) const {
  const OwnedRange& r = range(StateKind::grad_shard, block);
  std::vector<std::array<size_t, 2>> out;
  size_t at = r.lo;
  for (const auto& [lo, hi] : blocks.at(block).norm_excluded) {  // in order, disjoint
    if (hi <= at || lo >= r.hi) continue;
    if (lo > at) out.push_back({at - r.lo, lo - r.lo});
    at = std::max(at, hi);
  }
  if (at < r.hi) out.push_back({at - r.lo, r.hi - r.lo});
  return out;
}

std::vector<std::array<size_t, 2>> Plan::bucket_counted_in_norm(int bucket) const {
  std::vector<std::array<size_t, 2>> out;
  size_t base = 0;
  for (int b : reduce_buckets.at(bucket).blocks) {
    for (const auto& [lo, hi] : counted_in_norm(b)) {
      if (!out.empty() && out.back()[1] == base + lo) out.back()[1] = base + hi;
      else out.push_back({base + lo, base + hi});
    }
    base += range(StateKind::grad_shard, b).numel();
  }
  return out;
}

bool Plan::bucket_fully_counted(int bucket) const {
  for (int b : reduce_buckets.at(bucket).blocks) {
    if (!blocks[b].norm_excluded.empty()) return false;
  }
  return true;
}

}  // namespace zeroth
