// The engine's plan: decided once from the blocks, the config, the data-parallel group and the
// order of the micro-batches' passes, then interpreted by the executor every step.
//
// It has three parts:
// - shard state as data: each block's flat layout, and for every block and kind of state (fp32
//   master, moments, gradients, compute-dtype parameters) the element range this rank owns, the
//   buffer it lives in, its offset there and the buffer's tier. Everything that touches a rank's
//   state (the reducer, the optimizer, initialization, inspection, next checkpoints, swappers and
//   the estimator) walks this one list.
// - the program: a typed list of actions keyed by (micro-batch, block, pass) for one
//   accumulation cycle (gather, release, place gradients, accumulate, reduce a bucket, ...), one
//   for a forward-only evaluation pass, and the step's own (norm, update sub-groups, post-step
//   gather). Stages, and later offload and pipelines, are different programs; the executor only
//   interprets them.
// - bytes per tier and tag that the rank holds at peak.
// Every rank computes the same plan, so collective membership and order never depend on what
// happens at run time.
#pragma once

#include <array>        // std::array
#include <cstddef>      // size_t
#include <cstdint>      // uint8_t
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

#include "core/dtype.h"             // DType
#include "core/memory.h"            // MemTag
#include "engine/config/config.h"   // EngineConfig
#include "engine/plan/action.h"     // Action, ActionKind
#include "engine/plan/placement.h"  // Tier, TierBytes
#include "models/block_api.h"       // BlockSpec, BlockSchedule, Pass

namespace zeroth {

// Writing a block's values into the engine (initialization, a checkpoint's load) goes
// kTransferChunkNumel values at a time, and state in a swap file moves (both ways) through aligned
// bounce buffers of at most kTransferBounceBytes: the engine's scratch is a few chunks, not a block
// (315 MB of f32 for one layer of a 2B-parameter GPT). Reads return whole ranges to the caller.
inline constexpr size_t kTransferChunkNumel = size_t{1} << 22;
inline constexpr size_t kTransferBounceBytes = size_t{16} << 20;

// ---- shard state ------------------------------------------------------------------------------

// What a rank holds of a block. `params` are the full compute-dtype parameters the model reads
// (every block at stages 0-2, persistent blocks at stage 3); `param_shard` is this rank's slice of
// them (inside `params` at stages 1-2); `grad_accum` the f32 gradients summed over micro-batches
// (stages 0-1); `grad_shard` the reduced gradients the optimizer reads: f32, or in a swap file the
// reduction's dtype where that is exact (plan.cc, swapped_grad_dtype).
enum class StateKind : uint8_t { params = 0, param_shard, master, moment0, moment1, grad_accum, grad_shard };
inline constexpr size_t kStateKindCount = 7;
std::string_view state_kind_name(StateKind kind);

// One allocation of the rank, on one tier.
struct PlannedBuffer {
  std::string name;
  Tier tier = Tier::device;
  MemTag tag = MemTag::other;
  DType dtype = DType::f32;
  size_t numel = 0;
  bool zeroed = false;  // starts at zero (moments, gradient accumulators)
  // A swap file holding two copies of its state (numel counts both): the master weights and
  // moments of sub-groups updated during the backward pass, whose new values go to the copy the
  // last step did not write until the step commits (Plan::in_backward).
  bool two_copies = false;
  size_t bytes() const { return numel * dtype_size(dtype); }
};

// Elements [lo, hi) of a block's padded flat space, held by this rank in `buffer` from `offset`.
struct OwnedRange {
  StateKind kind = StateKind::params;
  int block = -1;
  size_t lo = 0, hi = 0;
  int buffer = -1;
  size_t offset = 0;
  size_t numel() const { return hi - lo; }
};
// Two ranges put the same elements at the same place.
inline bool same_place(const OwnedRange& a, const OwnedRange& b) { return a.buffer == b.buffer && a.offset - a.lo == b.offset - b.lo; }

struct PlannedBlock {
  std::string name;
  std::vector<size_t> param_offsets;  // element offsets in the block's flat buffer
  size_t numel = 0;                   // sum of parameter sizes, without padding
  size_t padded = 0;                  // flat size: a multiple of its group's ranks * alignment
  size_t shard = 0;                   // padded / its group's ranks
  size_t shard_offset = 0;            // in the rank's concatenated shard space
  size_t full_offset = 0;             // in the concatenated full space
  bool persistent = false;            // stage 3: small enough to stay gathered
  // Holds this rank's experts (BlockSpec::expert_parallel): partitioned and reduced over the
  // expert-data-parallel group (Plan::group_ranks), not the whole data-parallel one.
  bool expert = false;
  bool transient_grads = false;  // gradients live in the arena per micro-batch
  // BlockSpec::frozen: parameters only (params, param_shard), placed after every trainable block
  // in shard order, so the optimizer's state and the gradients cover a prefix of the shard and full
  // spaces (Plan::trainable_shard, trainable_padded) and a frozen block costs them nothing.
  bool frozen = false;
  int chunk = 0;  // the model chunk whose passes use it
  int reduce_bucket = -1;
  int gather_bucket = -1;  // the post-step all-gather bucket, if any
  // Ranges [lo, hi) of the flat space: gradients this rank leaves out of the global norm because
  // another rank counts them (parameters replicated over the tensor-parallel group count on its
  // rank 0; a tied copy that does not count), and gradients that are partial sums over the
  // tensor-parallel group (sequence parallelism), summed over it before the data-parallel reduction.
  std::vector<std::array<size_t, 2>> norm_excluded, tp_partial;
};

// Consecutive blocks in shard order whose collective runs as one.
struct Bucket {
  std::vector<int> blocks;
  size_t shard_offset = 0;  // of the first block
  size_t shard_numel = 0;   // per rank
  size_t full_offset = 0;
  bool staged = false;            // goes through the rank-major staging buffer (more than one block, or a dtype change)
  bool from_accumulator = false;  // reduces the f32 accumulator (stages 0-1), else the blocks' gradient buffers
};

// An update range of the optimizer: owned elements [lo, hi) of a block with one weight decay.
// tensor: for an optimizer whose update needs norms of whole tensors (Lamb), the parameter tensor
// the range lies in (its pair in the buffer `tensor_norms`; numbered over all blocks in registration
// order); -1 otherwise.
struct UpdateSpan {
  int block = -1;
  size_t lo = 0, hi = 0;
  bool decay = true;
  int tensor = -1;
};

// ---- the program: actions (action.h) keyed by their use ----------------------------------------

// One pass of one micro-batch of the accumulation cycle, over one model chunk: the blocks of
// schedules[chunk] (a pipeline rank with interleaving holds several chunks; otherwise chunk 0 is
// the whole model).
struct PassRef {
  int micro = 0;
  Pass pass = Pass::forward;
  int chunk = 0;
  bool operator==(const PassRef&) const = default;
};

// F0 B0 F1 B1 ...: each micro-batch's forward then backward.
std::vector<PassRef> sequential_passes(int micro_batches);
// One-forward-one-backward with `in_flight` micro-batches forwarded ahead:
// F0 .. F{k-1}, then B0 F{k} B1 F{k+1} ..., then the remaining backwards (k = in_flight).
std::vector<PassRef> one_f_one_b_passes(int micro_batches, int in_flight);

struct Plan {
  int stage = 0;
  int dp = 1;
  int rank = 0;
  int tp = 1, tp_rank = 0;  // the tensor-parallel group the blocks' parameters are split over
  // Expert parallelism: the data-parallel ranks share each expert layer's experts out in runs of
  // `ep` (rank r holds slice r mod ep); an expert block is partitioned over the dp / ep ranks that
  // hold the same slice (the expert-data-parallel group: rank r is its member r / ep).
  int ep = 1;
  size_t tp_replicated = 0;  // elements of parameters every tensor-parallel rank holds whole
  int stages = 1;            // pipeline stages the global norm sums over (set by the engine, or the trainer's planning)
  DType compute_dtype = DType::f32;
  DType comm_dtype = DType::f32;
  int micro_batches = 1;             // per accumulation cycle
  int chunks = 1;                    // model chunks: pass orders (PassRef::chunk) and block schedules
  int max_in_flight = 1;             // micro-batches forwarded but not yet backwarded, at most, in a chunk
  std::vector<int> chunk_in_flight;  // the same for each chunk
  std::vector<PlannedBlock> blocks;  // in registration order
  std::vector<int> shard_order;      // block indices by last backward use
  std::vector<PlannedBuffer> buffers;
  std::vector<OwnedRange> owned;
  std::vector<std::array<int, kStateKindCount>> owned_index;  // [block][kind] -> index in owned, or -1
  std::vector<Bucket> reduce_buckets, gather_buckets;
  std::vector<std::vector<UpdateSpan>> sub_groups;
  // Each sub-group's extent in the buffers that hold its state (elements; the rank's owned space,
  // counted from the offloaded part's start for offloaded sub-groups): contiguous, so one read and
  // one write per array move a sub-group to and from its swap file.
  std::vector<std::array<size_t, 2>> sub_group_extent;
  // Sub-groups the cycle's program updates during the backward pass, as soon as their gradients
  // are final (offload_optimizer.overlap_backward): swap_in, update, upload and swap_out actions
  // after the offload_grads that completes them. The step commits their result, or redoes them.
  std::vector<bool> in_backward;
  // offload_optimizer.delayed_update: the step program's update sweep (swap_in, update, swap_out)
  // may run in the background under the next cycle, its parameters written into param_out (the
  // whole offloaded shard) and published by the upload actions that follow it, at the step that
  // ends that next cycle (Executor::finish_step).
  bool delayed_update = false;
  // The next cycle's gathers wait for the uploads of the sub-groups that hold their blocks, not for
  // the whole update sweep, which runs in the order the next forward pass needs the blocks (post-
  // step gathers first): its forward starts beside the rest of the sweep. Serial offloaded updates
  // at stage 3 (no delayed update, no sub-group updated in the backward pass).
  bool publish_by_sub_group = false;
  // The leading reduce buckets (in shard order) whose reduced gradients and optimizer state stay
  // on the device: every bucket without offload_optimizer, those that fit in (1 - ratio) of the
  // owned space with it. device_owned: the owned elements they hold (the offloaded part's start).
  int device_buckets = 0;
  size_t device_owned = 0;
  std::vector<PassRef> passes;
  std::vector<Action> program;                                            // one accumulation cycle, in the order of `passes`
  std::vector<Action> eval_program;                                       // one forward-only pass (validation)
  std::vector<Action> step_program;                                       // at the end of the cycle
  size_t total_numel = 0, total_padded = 0, shard_numel = 0;              // shard_numel: this rank's, all blocks
  size_t trainable_numel = 0, trainable_padded = 0, trainable_shard = 0;  // the same, of the blocks not frozen
  int param_arena = -1, grad_arena = -1, reduce_staging = -1, gather_staging = -1, scalar = -1;  // buffers
  int tensor_norms = -1;  // buffer: two f32 per parameter tensor (Lamb's trust ratio), or -1
  // Offload buffers on the host, or -1: a piece of a bucket's reduced gradient slice as it arrives
  // from the device (communication dtype), two such pieces in f32 on their way to the swap file
  // (one written while the next is cast), the narrow
  // parameters an update writes for upload (two sub-groups; with delayed_update, the whole
  // offloaded shard), and the swap slots (each holds a
  // sub-group's master, moments and gradients, in that order).
  int grad_staging = -1, grad_host = -1, param_out = -1, swap_slots = -1;
  int param_staging = -1;  // a block's parameter shard read from its swap file before the device copy
  size_t slot_numel = 0;   // elements per array in a swap or param_out slot: the largest sub-group
  // Offloaded gradients leave the device in pieces of this many elements: the bytes aio keeps in
  // flight (block_size x queue_depth) in the gradient file's dtype, so that one piece's write fills
  // the queue while the next is cast, or the largest offloaded bucket's shard where that is less.
  // The host then stages one piece (grad_staging) and, with nvme, two more on their way to the file
  // (grad_host, in the file's dtype), not a bucket's shard (hundreds of MiB at the buckets large
  // models use). The file holds the reduction's dtype where that is exact (plan.cc,
  // swapped_grad_dtype), else f32.
  size_t grad_piece_numel = 0;
  // Pipelines: the block whose copy on the first and the last stage is one tied parameter (GPT's
  // token embedding and LM head): its reduced gradients are summed over that pair at the step, and
  // it counts in the global norm on one side only. tie_staging: a device buffer its gradients pass
  // through when they are offloaded.
  int tied_block = -1;
  bool tied_in_norm = true;
  int tie_staging = -1;
  TierBytes bytes{};  // what the engine holds per tier and tag at peak

  // The group a block is partitioned and reduced over: its size and this rank's place in it.
  // Data-parallel rank `dp_rank`'s place in that group (this rank's by default), and whether it
  // holds this rank's slice of the experts (every rank holds a dense block).
  int group_ranks(int block) const { return blocks.at(block).expert ? dp / ep : dp; }
  int group_rank(int block, int dp_rank) const { return blocks.at(block).expert ? dp_rank / ep : dp_rank; }
  int group_rank(int block) const { return group_rank(block, rank); }
  bool holds_my_slice(int block, int dp_rank) const { return !blocks.at(block).expert || dp_rank % ep == rank % ep; }
  // The owned range of a kind of a block, or nullptr when the rank holds none.
  const OwnedRange* find(StateKind kind, int block) const;
  const OwnedRange& range(StateKind kind, int block) const;  // throws when there is none
  // The padded elements [lo, hi) of a block that the rank keeps any copy of (full parameters,
  // parameter shard, master): what writing the block's values touches.
  // values_owned: the range whose f32 values a checkpoint saves for the rank: the master, or a
  // frozen block's parameter shard (read widened).
  std::array<size_t, 2> values_range(int block) const;
  const OwnedRange& values_owned(int block) const;
  // The range of an f32 kind a checkpoint reads: values_owned for the master, else range().
  const OwnedRange& f32_range(StateKind kind, int block) const {
    return kind == StateKind::master ? values_owned(block) : range(kind, block);
  }
  // The parts of the rank's reduced gradients that count in the global norm: [begin, end) within
  // the block's grad_shard range, or within the bucket's reduced gradients (its blocks' ranges
  // end to end).
  std::vector<std::array<size_t, 2>> counted_in_norm(int block) const;
  std::vector<std::array<size_t, 2>> bucket_counted_in_norm(int bucket) const;
  bool bucket_fully_counted(int bucket) const;
  bool bucket_offloaded(int bucket) const { return bucket >= device_buckets; }
  bool block_offloaded(int block) const { return !blocks.at(block).frozen && bucket_offloaded(blocks.at(block).reduce_bucket); }
  bool sub_group_offloaded(int sub_group) const { return block_offloaded(sub_groups.at(sub_group).front().block); }
  size_t buffer_numel(int buffer) const { return buffer < 0 ? 0 : buffers[buffer].numel; }
  size_t device_bytes() const { return tier_total(bytes, Tier::device); }
  nlohmann::json to_json() const;
  std::string table() const;  // compact, for the log at start
  // The groups a collective action runs in ("dp", "edp" for an expert block's, "tp", "dp+pp+tp", ...),
  // or "" for local work; `target` is the action's (its block or bucket), -1 for the kind's usual group.
  std::string group_of(ActionKind kind, int target = -1) const;
  std::string program_summary() const;  // counts per action kind and the first micro-batch in full
  // Writes to_json() to the path in ZEROTH_PLAN_JSON, when it is set (IoError if that fails).
  void write_json_if_requested() const;
};

// ConfigError unless every block is used forward and backward, in exactly one chunk.
void check_block_schedules(const std::vector<BlockSchedule>& chunks, size_t blocks);
// ConfigError unless `passes` runs every micro-batch of every chunk forward then backward, each
// chunk's in micro-batch order; the most micro-batches in flight in each chunk.
std::vector<int> check_passes(const std::vector<PassRef>& passes, int micro_batches, int chunks);

// Throws ConfigError on a schedule that names unknown blocks or misses one, or on a pass order
// that is not a valid order of the cycle's micro-batches. Empty `passes`: sequential.
Plan make_plan(const std::vector<BlockSpec>& blocks, const BlockSchedule& schedule, const EngineConfig& config, int dp, int rank,
               std::vector<PassRef> passes = {});
// The same for a model in chunks (a pipeline rank's virtual stages): schedules[c] uses chunk c's
// blocks, each block belongs to one chunk, and `passes` runs every (micro-batch, chunk) forward
// then backward, each chunk's micro-batches in order.
Plan make_plan(const std::vector<BlockSpec>& blocks, const std::vector<BlockSchedule>& schedules, const EngineConfig& config, int dp,
               int rank, std::vector<PassRef> passes);

// From a block's parameters' tensor-parallel splits (ParamSpec::tp): its norm_excluded and tp_partial
// ranges, and the plan's tensor-parallel group (InvalidArgument when two parameters disagree on it).
void plan_tensor_parallel(Plan& plan, PlannedBlock& block, const BlockSpec& spec);

// Marks `block` as one copy of a parameter tied across pipeline stages (Plan::tied_block), adding
// the staging buffer offloaded gradients need. On a plan from make_plan, once.
void tie_block(Plan& plan, int block, bool counts_in_norm);

// The program part of make_plan, on a plan whose layout and buckets are made: fills the cycle's
// and the evaluation's programs and returns the arena high-water marks they need (elements of
// the compute dtype).
struct ArenaSizes {
  size_t params = 0, grads = 0;
};
ArenaSizes build_programs(Plan& plan, const std::vector<BlockSchedule>& schedules, const EngineConfig& config);
// The step's program, on a plan whose sub-groups and offload buffers are made; `slots`: the host
// slots offloaded sub-groups take turns in.
void build_step_program(Plan& plan, const OffloadConfig& offload, size_t slots);
// With offload_optimizer.overlap_backward on swapped state: each offloaded sub-group's swap_in,
// update, upload and swap_out go into the cycle's program right after the offload_grads that
// makes its gradients final (in the slots the step program gives it), and its master and moment
// files hold two copies. On a plan after build_step_program.
void schedule_updates_in_backward(Plan& plan, const OffloadConfig& offload);

}  // namespace zeroth
