// Building the plan: each block's layout and shard, the rank's buffers and owned ranges, the
// buckets and optimizer sub-groups, then the programs (program.cc) and the bytes per tier and tag.
// Stage differences are decided here and in program.cc, nowhere else.
#include "engine/plan/plan.h"

#include <algorithm>  // std::max, std::sort
#include <set>        // std::set

#include "core/error.h"  // ZEROTH_THROW

namespace zeroth {
namespace {

// Parameters inside a block start on this many elements, so every view is 32-byte aligned in f32.
constexpr size_t kParamAlign = 8;


// f32 elements in 4 KiB, the O_DIRECT alignment of swap files (offload/aligned_buffer.h).
constexpr size_t kSwapQuantum = 1024;

// The dtype of the reduced gradients' swap file. A bucket's reduced slice arrives in the
// reduction's dtype and is written once per cycle where nothing adds to it afterwards (stages 2-3
// with one micro-batch; stage 1, which reduces its f32 accumulator once), so a narrow reduction's
// values are exact in its own dtype: the file keeps them so, half the bytes of f32 written and
// read back each step. Where micro-batches add into the file, f32. tie_block() widens it again.
DType swapped_grad_dtype(const EngineConfig& config) {
  const auto& z = config.zero;
  const bool adds = z.stage >= 2 && config.gradient_accumulation_steps > 1;
  if (z.offload_optimizer.device != OffloadDevice::nvme || z.stage < 1 || adds) return DType::f32;
  return config.communication_dtype;
}

size_t swap_slot_count(const OffloadConfig& o) { return 1 + (o.pipeline_read ? 1 : 0) + (o.pipeline_write ? 1 : 0); }
// Slots the offloaded update cycles through (update action's offset): the swap slots, or two in
// host memory, so one sub-group's upload overlaps the next one's update.
size_t update_slot_count(const OffloadConfig& o) { return o.device == OffloadDevice::nvme ? swap_slot_count(o) : 2; }

std::vector<Bucket> make_buckets(const Plan& p, uint64_t limit, const std::vector<int>& order) {
  std::vector<Bucket> out;
  size_t full = 0;
  for (int b : order) {
    const auto& blk = p.blocks[b];
    // A bucket holds one chunk's blocks: chunks' backward passes interleave, and a bucket fires when
    // all of its blocks are done with the same micro-batch.
    // Nor does it mix groups: its collective runs in one.
    if (out.empty() || full + blk.padded > limit || p.blocks[out.back().blocks.back()].chunk != blk.chunk ||
        p.blocks[out.back().blocks.back()].expert != blk.expert) {
      out.push_back({{}, blk.shard_offset, 0, blk.full_offset, false});
      full = 0;
    }
    out.back().blocks.push_back(b);
    out.back().shard_numel += blk.shard;
    full += blk.padded;
  }
  return out;
}

int add_buffer(Plan& p, std::string name, MemTag tag, DType dtype, size_t numel, bool zeroed = false, Tier tier = Tier::device) {
  if (numel == 0) return -1;
  p.buffers.push_back({std::move(name), tier, tag, dtype, numel, zeroed});
  return static_cast<int>(p.buffers.size()) - 1;
}

// Where offloaded state lives: the optimizer's (master, moments, reduced gradients) or stage 3's
// parameter shards, by their section; and the host memory the optimizer's transfers go through.
Tier offload_tier(const OffloadConfig& o) {
  switch (o.device) {
    case OffloadDevice::none: return Tier::device;
    case OffloadDevice::cpu: return o.pin_memory ? Tier::pinned_host : Tier::host;
    case OffloadDevice::nvme: return Tier::nvme;
  }
  return Tier::device;
}
Tier staging_tier(const ZeroConfig& z) { return z.offload_optimizer.pin_memory ? Tier::pinned_host : Tier::host; }

// offload_optimizer.ratio: the leading reduce buckets that fit in (1 - ratio) of the owned space
// stay on the device, as DeepSpeed keeps its first int((1 - ratio) x n) sub-groups on the GPU;
// a bucket's gradients take one way, so the split falls between buckets.
void split_offload(Plan& p, const OffloadConfig& o) {
  const int n = static_cast<int>(p.reduce_buckets.size());
  const double owned = static_cast<double>(p.trainable_shard);
  const double keep = o.enabled() ? (1.0 - o.ratio) * owned : owned;
  p.device_buckets = 0;
  p.device_owned = 0;
  while (p.device_buckets < n && static_cast<double>(p.device_owned + p.reduce_buckets[p.device_buckets].shard_numel) <= keep)
    p.device_owned += p.reduce_buckets[p.device_buckets++].shard_numel;
  if (!o.enabled()) p.device_buckets = n;
}

void own(Plan& p, StateKind kind, int block, size_t lo, size_t hi, int buffer, size_t offset) {
  p.owned_index[block][static_cast<size_t>(kind)] = static_cast<int>(p.owned.size());
  p.owned.push_back({kind, block, lo, hi, buffer, offset});
}

// The rank's buffers, in the order they are allocated, and what of every block lives where.
void lay_out_state(Plan& p, const EngineConfig& config, const ArenaSizes& arenas) {
  const int stage = p.stage;
  const DType c = p.compute_dtype;
  const Tier opt = offload_tier(config.zero.offload_optimizer);
  // f32 parameters on the device are their own master copy where the master stays there too.
  const bool sharded_params = stage == 3, aliases = c == DType::f32;
  size_t persistent = 0;
  for (const auto& blk : p.blocks) persistent += blk.persistent ? blk.padded : 0;
  const size_t owned_numel = stage == 0 ? p.trainable_padded : p.trainable_shard;
  const int shard_buf = sharded_params ? add_buffer(p, "param_shard", MemTag::params, c, p.shard_numel, false,
                                                    offload_tier(config.zero.offload_param))
                                       : -1;
  const int params_buf = add_buffer(p, "params", MemTag::params, c, sharded_params ? persistent : p.total_padded);
  p.param_arena = add_buffer(p, "param_arena", MemTag::params, c, arenas.params);
  // The optimizer's state and the reduced gradients: offloaded past device_owned (all of it at
  // ratio 1), on the device before (all of it without offload).
  struct Home {
    int master = -1, moment[2] = {-1, -1}, grad_shard = -1;
  };
  auto make_home = [&](Tier tier, size_t numel, const std::string& prefix) {
    Home h;
    if (!aliases || tier != Tier::device)
      h.master = add_buffer(p, prefix + "master", MemTag::optimizer, DType::f32, numel, false, tier);
    for (int k = 0; k < config.optimizer.state_arrays(); ++k)
      h.moment[k] = add_buffer(p, prefix + (k == 0 ? "moment0" : "moment1"), MemTag::optimizer, DType::f32, numel, true, tier);
    const DType grads = tier == Tier::nvme ? swapped_grad_dtype(config) : DType::f32;
    if (stage >= 1) h.grad_shard = add_buffer(p, prefix + "grad_shard", MemTag::grads, grads, numel, true, tier);
    return h;
  };
  const size_t kept = opt == Tier::device ? owned_numel : p.device_owned;
  const Home device_home = make_home(Tier::device, kept, opt == Tier::device ? "" : "device_");
  const Home offloaded_home = make_home(opt, owned_numel - kept, "");
  const int accum_buf = stage <= 1 ? add_buffer(p, "grad_accum", MemTag::grads, DType::f32, p.trainable_padded, true) : -1;

  p.owned_index.assign(p.blocks.size(), {});
  for (auto& idx : p.owned_index) idx.fill(-1);
  size_t persistent_at = 0;
  for (int b : p.shard_order) {
    const auto& blk = p.blocks[b];
    // What the optimizer owns: the whole block at stage 0, this rank's slice otherwise.
    const size_t lo = stage == 0 ? 0 : static_cast<size_t>(p.group_rank(b)) * blk.shard, hi = stage == 0 ? blk.padded : lo + blk.shard;
    const bool offloaded = p.block_offloaded(b);
    const Home& home = offloaded ? offloaded_home : device_home;
    const size_t owned_at = (stage == 0 ? blk.full_offset : blk.shard_offset) - (offloaded ? kept : 0);
    if (!sharded_params) {
      own(p, StateKind::params, b, 0, blk.padded, params_buf, blk.full_offset);
      own(p, StateKind::param_shard, b, lo, hi, params_buf, blk.full_offset + lo);
    } else {
      if (blk.persistent) {
        own(p, StateKind::params, b, 0, blk.padded, params_buf, persistent_at);
        persistent_at += blk.padded;
      }
      own(p, StateKind::param_shard, b, lo, hi, shard_buf, blk.shard_offset);
    }
    if (blk.frozen) continue;
    if (aliases && !offloaded) {
      const auto& shard = p.range(StateKind::param_shard, b);
      own(p, StateKind::master, b, lo, hi, shard.buffer, shard.offset);
    } else {
      own(p, StateKind::master, b, lo, hi, home.master, owned_at);
    }
    for (int k = 0; k < 2; ++k) {
      if (home.moment[k] >= 0) own(p, k == 0 ? StateKind::moment0 : StateKind::moment1, b, lo, hi, home.moment[k], owned_at);
    }
    if (accum_buf >= 0) own(p, StateKind::grad_accum, b, 0, blk.padded, accum_buf, blk.full_offset);
    // Stage 0's reduced gradients are the all-reduced accumulator itself.
    if (stage >= 1) {
      own(p, StateKind::grad_shard, b, lo, hi, home.grad_shard, owned_at);
    } else {
      own(p, StateKind::grad_shard, b, lo, hi, accum_buf, blk.full_offset);
    }
  }
}

// The optimizer's owned ranges split where weight decay changes (padding after a parameter goes
// with it and stays zero under every update), cut into sub-groups: contiguous pieces of the
// rank's owned space of at most `limit` elements, starting on multiples of `quantum` (so a
// sub-group's bytes in a swap file start and end on the file's I/O alignment).
// per_tensor: split at every parameter too and name its tensor (a block without parameters has
// nothing to update then).
void make_sub_groups(Plan& p, const std::vector<BlockSpec>& specs, const WeightDecayRule& rule, uint64_t limit, size_t quantum,
                     bool per_tensor) {
  std::vector<int> first_tensor(specs.size() + 1, 0);
  for (size_t b = 0; b < specs.size(); ++b) first_tensor[b + 1] = first_tensor[b] + static_cast<int>(specs[b].params.size());
  const size_t cap = std::max<size_t>(quantum, limit / quantum * quantum);
  size_t group_end = 0;
  bool group_offloaded = false;
  auto add_span = [&](int b, size_t lo, size_t hi, bool wd, int tensor) {
    // Owned position of element `lo` (from the offloaded part's start when offloaded): where the
    // state buffers hold it. A sub-group is either offloaded or not.
    const auto& blk = p.blocks[b];
    const auto& m = p.range(StateKind::master, b);
    const bool offloaded = p.block_offloaded(b);
    const size_t base = (p.stage == 0 ? blk.full_offset : blk.shard_offset) - (offloaded ? p.device_owned : 0) - m.lo;
    for (size_t s = lo; s < hi;) {
      const size_t pos = base + s;
      if (p.sub_groups.empty() || pos >= group_end || offloaded != group_offloaded) {
        group_offloaded = offloaded;
        p.sub_groups.emplace_back();
        p.sub_group_extent.push_back({pos, pos});
        group_end = pos + cap;
      }
      const size_t e = std::min(hi, s + (group_end - pos));
      p.sub_groups.back().push_back({b, s, e, wd, tensor});
      p.sub_group_extent.back()[1] = base + e;
      s = e;
    }
  };
  for (int b : p.shard_order) {
    if (p.blocks[b].frozen || (per_tensor && specs[b].params.empty())) continue;
    const auto& blk = p.blocks[b];
    const auto& params = specs[b].params;
    const auto& m = p.range(StateKind::master, b);
    size_t at = m.lo;
    while (at < m.hi) {
      size_t i = 0;
      while (i + 1 < params.size() && blk.param_offsets[i + 1] <= at) ++i;
      auto decays = [&](size_t q) { return rule.decays(specs[b].name, params[q]); };
      const bool wd = params.empty() || decays(i);
      size_t end = m.hi;
      for (size_t q = i + 1; q < params.size(); ++q) {
        if (per_tensor || decays(q) != wd) {
          end = std::min(m.hi, blk.param_offsets[q]);
          break;
        }
      }
      add_span(b, at, end, wd, per_tensor ? first_tensor[b] + static_cast<int>(i) : -1);
      at = end;
    }
  }
  if (per_tensor)
    p.tensor_norms = add_buffer(p, "tensor_norms", MemTag::optimizer, DType::f32, 2 * static_cast<size_t>(first_tensor.back()), true);
}

// The host buffers offload moves state through (plan.h): sized by the largest bucket and
// sub-group.
void add_offload_buffers(Plan& p, const EngineConfig& config) {
  const auto& o = config.zero.offload_optimizer;
  if (!o.enabled()) return;
  const Tier host = staging_tier(config.zero);
  size_t bucket = 0;
  for (size_t k = 0; k < p.reduce_buckets.size(); ++k)
    if (p.bucket_offloaded(static_cast<int>(k))) bucket = std::max(bucket, p.reduce_buckets[k].shard_numel);
  for (size_t g = 0; g < p.sub_groups.size(); ++g) {
    const auto& e = p.sub_group_extent[g];
    if (p.sub_group_offloaded(static_cast<int>(g))) p.slot_numel = std::max(p.slot_numel, e[1] - e[0]);
  }
  if (bucket == 0) return;  // ratio 0: nothing leaves the device
  // A piece ends on a 4 KiB boundary of its file range, so rounding its write up stays in the buffer.
  const size_t file_element = dtype_size(o.device == OffloadDevice::nvme ? swapped_grad_dtype(config) : DType::f32);
  const size_t io_elements = 4096 / file_element;
  const size_t in_flight = config.aio.block_size * config.aio.queue_depth / file_element;  // a multiple of io_elements
  p.grad_piece_numel = std::min(in_flight, round_up(bucket, io_elements));
  const size_t host_pieces = bucket > p.grad_piece_numel ? 2 : 1;
  p.grad_staging = add_buffer(p, "grad_staging", MemTag::buffers, p.comm_dtype, p.grad_piece_numel, false, host);
  if (config.zero.offload_param.device == OffloadDevice::nvme) {
    // A block's parameter shard on its way from the file to the device (gathers run one at a time).
    size_t shard = 0;
    for (const auto& blk : p.blocks) shard = std::max(shard, blk.shard);
    p.param_staging = add_buffer(p, "param_staging", MemTag::params, p.compute_dtype, shard, false,
                                 config.zero.offload_param.pin_memory ? Tier::pinned_host : Tier::host);
  }
  if (o.device == OffloadDevice::nvme) {
    p.grad_host = add_buffer(p, "grad_host", MemTag::buffers, swapped_grad_dtype(config), host_pieces * p.grad_piece_numel, false,
                             host);
    const size_t arrays = 2 + static_cast<size_t>(config.optimizer.state_arrays());
    p.swap_slots = add_buffer(p, "swap_slots", MemTag::optimizer, DType::f32, swap_slot_count(o) * arrays * p.slot_numel, false, host);
  }
  // A delayed update's parameters wait for their step in param_out, f32 ones too (the master
  // weights they would be copied from change under the next update or leave with their slot).
  if (o.delayed_update) {
    size_t offloaded = 0;
    for (size_t g = 0; g < p.sub_groups.size(); ++g)
      if (p.sub_group_offloaded(static_cast<int>(g))) offloaded = std::max(offloaded, p.sub_group_extent[g][1]);
    p.param_out = add_buffer(p, "param_out", MemTag::params, p.compute_dtype, offloaded, false, host);
  } else if (p.compute_dtype != DType::f32) {
    p.param_out = add_buffer(p, "param_out", MemTag::params, p.compute_dtype, update_slot_count(o) * p.slot_numel, false, host);
  }
}

}  // namespace

const OwnedRange* Plan::find(StateKind kind, int block) const {
  const int i = owned_index.at(block)[static_cast<size_t>(kind)];
  return i < 0 ? nullptr : &owned[i];
}

const OwnedRange& Plan::range(StateKind kind, int block) const {
  const auto* r = find(kind, block);
  ZEROTH_CHECK(r != nullptr, "rank {} holds no {} of block {}", rank, state_kind_name(kind), blocks.at(block).name);
  return *r;
}

std::array<size_t, 2> Plan::values_range(int block) const {
  const OwnedRange* params = find(StateKind::params, block);
  const OwnedRange& shard = range(StateKind::param_shard, block);
  size_t lo = shard.lo, hi = shard.hi;
  if (const OwnedRange* master = find(StateKind::master, block)) lo = std::min(lo, master->lo), hi = std::max(hi, master->hi);
  if (params != nullptr) lo = std::min(lo, params->lo), hi = std::max(hi, params->hi);
  return {lo, hi};
}

const OwnedRange& Plan::values_owned(int block) const {
  return blocks.at(block).frozen ? range(StateKind::param_shard, block) : range(StateKind::master, block);
}

Plan make_plan(const std::vector<BlockSpec>& specs, const BlockSchedule& schedule, const EngineConfig& config, int dp, int rank,
               std::vector<PassRef> passes) {
  return make_plan(specs, std::vector<BlockSchedule>{schedule}, config, dp, rank, std::move(passes));
}

// Long: the plan built in dependency order (checks, blocks, shard order, buckets, programs and buffers, sub-groups, the step
// program); each step reads what the ones before it set in `p`.
Plan make_plan(const std::vector<BlockSpec>& specs, const std::vector<BlockSchedule>& schedules, const EngineConfig& config, int dp,
               int rank, std::vector<PassRef> passes) {
  config.validate();
  if (specs.empty()) ZEROTH_THROW(ConfigError, "the model registered no blocks");
  if (dp < 1 || rank < 0 || rank >= dp) ZEROTH_THROW(InvalidArgument, "make_plan: rank {} of {}", rank, dp);
  if (schedules.empty()) ZEROTH_THROW(ConfigError, "the model has no chunk schedule");
  check_block_schedules(schedules, specs.size());
  const auto& z = config.zero;
  const bool swapped = z.offload_optimizer.device == OffloadDevice::nvme;
  // Elements per 4 KiB (the swap files' I/O alignment) of every kind that lives in a swap file.
  size_t quantum = swapped ? std::max(kSwapQuantum, 4096 / dtype_size(swapped_grad_dtype(config))) : 1;
  if (z.offload_param.device == OffloadDevice::nvme) quantum = std::max(quantum, 4096 / dtype_size(config.compute_dtype));
  if (z.offload_optimizer.enabled() && config.optimizer.kind == OptimizerKind::lamb) {
    ZEROTH_THROW(ConfigError,
                 "optimizer Lamb with zero_optimization.offload_optimizer: the offloaded update runs Adam, AdamW or SGD (as "
                 "DeepSpeed's CPU optimizers); choose one of them or remove offload_optimizer");
  }
  // Swapped shards start and end on the swap files' I/O alignment in every block.
  const size_t alignment = std::max<size_t>(config.alignment, quantum);
  Plan p;
  p.stage = z.stage;
  p.dp = dp;
  p.rank = rank;
  p.compute_dtype = config.compute_dtype;
  p.comm_dtype = config.communication_dtype;
  p.micro_batches = static_cast<int>(config.gradient_accumulation_steps);
  p.chunks = static_cast<int>(schedules.size());
  if (passes.empty() && p.chunks > 1) ZEROTH_THROW(ConfigError, "a model in {} chunks needs its pass order", p.chunks);
  p.passes = passes.empty() ? sequential_passes(p.micro_batches) : std::move(passes);
  p.chunk_in_flight = check_passes(p.passes, p.micro_batches, p.chunks);
  p.max_in_flight = *std::max_element(p.chunk_in_flight.begin(), p.chunk_in_flight.end());

  for (const auto& spec : specs) {
    if (spec.expert_parallel < 1)
      ZEROTH_THROW(InvalidArgument, "block {} declares its experts shared over {} ranks; that is at least 1", spec.name,
                   spec.expert_parallel);
    if (spec.expert_parallel > 1 && p.ep > 1 && spec.expert_parallel != p.ep) {
      ZEROTH_THROW(ConfigError, "block {} holds experts shared over {} ranks where another block's are over {}", spec.name,
                   spec.expert_parallel, p.ep);
    }
    p.ep = std::max(p.ep, spec.expert_parallel);
  }
  if (dp % p.ep != 0) {
    ZEROTH_THROW(ConfigError,
                 "parallel.expert = {} must divide the data-parallel size ({}): the experts are shared out over runs of that many "
                 "data-parallel ranks",
                 p.ep, dp);
  }
  if (p.ep > 1 && z.stage >= 1 && config.optimizer.kind == OptimizerKind::lamb) {
    ZEROTH_THROW(ConfigError,
                 "optimizer Lamb with parallel.expert = {} at ZeRO stage {}: the pieces of Lamb's per-tensor norms are summed over "
                 "the whole data-parallel group, whose ranks hold different experts under the same tensor numbers; use Adam, AdamW "
                 "or SGD, or ZeRO stage 0, with expert parallelism",
                 p.ep, z.stage);
  }
  std::set<std::string> names;
  for (const auto& spec : specs) {
    if (!names.insert(spec.name).second)
      ZEROTH_THROW(ConfigError, "two blocks are named \"{}\"; block names must be unique", spec.name);
    PlannedBlock blk;
    blk.name = spec.name;
    std::set<std::string> pnames;
    for (const auto& param : spec.params) {
      if (!pnames.insert(param.name).second)
        ZEROTH_THROW(ConfigError, "block {} has two parameters named \"{}\"", spec.name, param.name);
      const bool fused = !blk.param_offsets.empty() && spec.params[blk.param_offsets.size() - 1].fused_with_next;
      if (!fused) blk.numel = round_up(blk.numel, kParamAlign);
      blk.param_offsets.push_back(blk.numel);
      blk.numel += param.numel();
    }
    plan_tensor_parallel(p, blk, spec);
    blk.expert = spec.expert_parallel > 1;
    const size_t ranks = static_cast<size_t>(blk.expert ? dp / p.ep : dp);
    blk.padded = round_up(std::max<size_t>(blk.numel, 1), ranks * alignment);
    blk.shard = blk.padded / ranks;
    blk.persistent = z.stage == 3 && blk.numel <= z.stage3_param_persistence_threshold;
    // Narrow gradients, and every gradient once they are reduced per micro-batch, live in the
    // arena only while their block needs them; stages 0-1 in f32 add straight into the accumulator.
    blk.frozen = spec.frozen;
    blk.transient_grads = !blk.frozen && (z.stage >= 2 || config.compute_dtype != DType::f32);
    // Stage 0 with experts: every rank holds whole reduced gradients, but of its own slice of the
    // experts, so the norm sums over the ranks; a dense block counts on rank 0, an expert block on
    // the first rank of each slice.
    if (z.stage == 0 && p.ep > 1 && (blk.expert ? rank / p.ep : rank) != 0) blk.norm_excluded = {{0, blk.padded}};
    p.total_numel += blk.numel;
    p.total_padded += blk.padded;
    if (!blk.frozen) p.trainable_numel += blk.numel, p.trainable_padded += blk.padded;
    p.blocks.push_back(std::move(blk));
  }
  // Every block frozen (a pipeline stage of frozen layers): no reduction and no update; the rank
  // still joins the global norm's sum over the stages with nothing of its own.

  // Shard order: by last backward use, so buckets fill in the order gradients complete (the
  // chunks in the order of their last backward pass); frozen blocks after all the others.
  std::vector<size_t> last_back(specs.size());
  std::vector<int> chunk_order;
  for (auto it = p.passes.rbegin(); it != p.passes.rend(); ++it) {
    if (it->pass == Pass::backward && std::find(chunk_order.begin(), chunk_order.end(), it->chunk) == chunk_order.end())
      chunk_order.insert(chunk_order.begin(), it->chunk);
  }
  size_t position = 0;
  for (int c : chunk_order) {
    for (int b : schedules[c].backward) last_back[b] = position++;
  }
  for (size_t c = 0; c < schedules.size(); ++c) {
    for (int b : schedules[c].forward) p.blocks[b].chunk = static_cast<int>(c);
  }
  for (size_t b = 0; b < specs.size(); ++b) p.shard_order.push_back(static_cast<int>(b));
  std::stable_sort(p.shard_order.begin(), p.shard_order.end(), [&](int a, int b) {
    return std::pair(p.blocks[a].frozen, last_back[a]) < std::pair(p.blocks[b].frozen, last_back[b]);
  });
  size_t full_numel = 0;
  std::vector<int> trained;  // the shard order's trainable prefix
  for (int b : p.shard_order) {
    auto& blk = p.blocks[b];
    blk.shard_offset = p.shard_numel;
    blk.full_offset = full_numel;
    p.shard_numel += blk.shard;
    full_numel += blk.padded;
    if (!blk.frozen) p.trainable_shard += blk.shard, trained.push_back(b);
  }

  // Stage 0 all-reduces the contiguous accumulator in place; the others reduce-scatter, which
  // needs a rank-major layout that only a single block has by itself.
  const DType grad_source = z.stage <= 1 ? DType::f32 : config.compute_dtype;
  size_t reduce_staging = 0, gather_staging = 0;
  p.reduce_buckets = make_buckets(p, z.reduce_bucket_size, trained);
  for (size_t k = 0; k < p.reduce_buckets.size(); ++k) {
    auto& bucket = p.reduce_buckets[k];
    bucket.staged = z.stage == 0 ? config.communication_dtype != DType::f32
                                 : bucket.blocks.size() > 1 || grad_source != config.communication_dtype;
    bucket.from_accumulator = z.stage <= 1;
    for (int b : bucket.blocks) p.blocks[b].reduce_bucket = static_cast<int>(k);
    if (bucket.staged) reduce_staging = std::max(reduce_staging, bucket.shard_numel * p.group_ranks(bucket.blocks.front()));
  }
  if (z.stage == 1 || z.stage == 2) {
    p.gather_buckets = make_buckets(p, z.allgather_bucket_size, trained);
  } else if (z.stage == 3) {
    // Persistent blocks are refreshed from their shards after each step, one by one.
    for (size_t b = 0; b < p.blocks.size(); ++b) {
      if (p.blocks[b].persistent && !p.blocks[b].frozen) p.gather_buckets.push_back(make_buckets(p, 0, {static_cast<int>(b)}).front());
    }
  }
  for (size_t k = 0; k < p.gather_buckets.size(); ++k) {
    auto& bucket = p.gather_buckets[k];
    bucket.staged = bucket.blocks.size() > 1;
    for (int b : bucket.blocks) p.blocks[b].gather_bucket = static_cast<int>(k);
    if (bucket.staged) gather_staging = std::max(gather_staging, bucket.shard_numel * p.group_ranks(bucket.blocks.front()));
  }

  split_offload(p, z.offload_optimizer);
  const ArenaSizes arenas = build_programs(p, schedules, config);
  lay_out_state(p, config, arenas);
  p.grad_arena = add_buffer(p, "grad_arena", MemTag::grads, config.compute_dtype, arenas.grads);
  p.reduce_staging = add_buffer(p, "reduce_staging", MemTag::buffers, config.communication_dtype, reduce_staging);
  p.gather_staging = add_buffer(p, "gather_staging", MemTag::buffers, config.compute_dtype, gather_staging);
  p.scalar = add_buffer(p, "scalar", MemTag::buffers, DType::f32, 1);

  config.no_weight_decay.check(specs);
  make_sub_groups(p, specs, config.no_weight_decay, std::max<uint64_t>(1, z.sub_group_size), quantum,
                  config.optimizer.kind == OptimizerKind::lamb);
  add_offload_buffers(p, config);
  build_step_program(p, z.offload_optimizer, update_slot_count(z.offload_optimizer));
  schedule_updates_in_backward(p, z.offload_optimizer);
  for (const auto& buf : p.buffers) at(p.bytes, buf.tier, buf.tag) += buf.bytes();
  return p;
}

}  // namespace zeroth
