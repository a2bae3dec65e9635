// The plan's parts that concern the other groups of a rank: its tensor-parallel ranges (which
// gradients count in the norm here, which are partial sums over the group), a pipeline's tied
// pair (tie_block), and their use by the norm, which also leaves out the pair's uncounted copy.
#include <algorithm>  // std::max

#include "core/error.h"  // ZEROTH_THROW
#include "engine/plan/plan.h"

namespace zeroth {

void tie_block(Plan& p, int block, bool counts_in_norm) {
  ZEROTH_CHECK(p.tied_block < 0 && block >= 0 && block < static_cast<int>(p.blocks.size()), "tie_block({}) on a plan of {} blocks",
               block, p.blocks.size());
  p.tied_block = block;
  p.tied_in_norm = counts_in_norm;
  if (!counts_in_norm) p.blocks[block].norm_excluded = {{0, p.blocks[block].padded}};
  if (p.blocks[block].frozen) return;  // no gradients to sum
  // Its gradients change at the step (summed with the other stage's copy): its sub-groups are
  // updated there, not during the backward pass.
  for (size_t g = 0; g < p.in_backward.size(); ++g) {
    if (!p.in_backward[g]) continue;
    bool tied = false;
    for (const auto& span : p.sub_groups[g]) tied = tied || span.block == block;
    if (!tied) continue;
    p.in_backward[g] = false;
    std::erase_if(p.program, [&](const Action& a) {
      const bool sub_group_op = a.as<op::SwapIn>() || a.as<op::Update>() || a.as<op::Upload>() || a.as<op::SwapOut>();
      return sub_group_op && action_target(a) == static_cast<int>(g);
    });
  }
  const OwnedRange& r = p.range(StateKind::grad_shard, block);
  // The tied pair's sum is not exact in the reduction's dtype: a narrow gradient file goes back to
  // f32 (the layout's 4 KiB quantum of the narrow type is a multiple of f32's).
  if (p.buffers[r.buffer].tier == Tier::nvme && p.buffers[r.buffer].dtype != DType::f32) {
    for (int k : {r.buffer, p.grad_host}) {
      PlannedBuffer& buf = p.buffers[k];
      at(p.bytes, buf.tier, buf.tag) -= buf.bytes();
      buf.dtype = DType::f32;
      at(p.bytes, buf.tier, buf.tag) += buf.bytes();
    }
  }
  if (p.buffers[r.buffer].tier != Tier::device) {
    p.buffers.push_back({"tie_staging", Tier::device, MemTag::buffers, DType::f32, r.numel()});
    p.tie_staging = static_cast<int>(p.buffers.size()) - 1;
    at(p.bytes, Tier::device, MemTag::buffers) += p.buffers[p.tie_staging].bytes();
  }
}

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
