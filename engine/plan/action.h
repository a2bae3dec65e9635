// The plan's program as data: each action a struct of its own with the fields it acts on, named,
// and its kind; an Action holds one of them with the key of the block use it belongs to. The
// planner emits them (program.cc), the executor interprets them, the plan JSON prints them.
#pragma once

#include <cstddef>      // size_t
#include <cstdint>      // uint8_t
#include <string_view>  // std::string_view
#include <utility>      // std::index_sequence
#include <variant>      // std::variant

#include "models/block_api.h"  // Pass

namespace zeroth {

// An action's kind, in the order of Action::Op's alternatives.
enum class ActionKind : uint8_t {
  run,
  gather,
  release,
  place_grads,
  accumulate,
  release_grads,
  all_reduce,
  reduce_scatter,
  grad_norm,
  update,
  zero,
  all_gather,
  update_norms,
  sum_norms,
  offload_grads,
  swap_in,
  swap_out,
  upload,
  sum_partial,
};
// A kind's name in the plan JSON and --dry-run. The switch has no default, so a kind added without
// a name is a -Wswitch warning (an error in CI's -Werror build).
constexpr std::string_view action_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::run: return "run";
    case ActionKind::gather: return "gather";
    case ActionKind::release: return "release";
    case ActionKind::place_grads: return "place_grads";
    case ActionKind::accumulate: return "accumulate";
    case ActionKind::release_grads: return "release_grads";
    case ActionKind::all_reduce: return "all_reduce";
    case ActionKind::reduce_scatter: return "reduce_scatter";
    case ActionKind::grad_norm: return "grad_norm";
    case ActionKind::update: return "update";
    case ActionKind::zero: return "zero";
    case ActionKind::all_gather: return "all_gather";
    case ActionKind::update_norms: return "update_norms";
    case ActionKind::sum_norms: return "sum_norms";
    case ActionKind::offload_grads: return "offload_grads";
    case ActionKind::swap_in: return "swap_in";
    case ActionKind::swap_out: return "swap_out";
    case ActionKind::upload: return "upload";
    case ActionKind::sum_partial: return "sum_partial";
  }
  return "invalid";
}

// What each kind acts on, named: a block (of the use, or one gathered ahead of it), a reduce or
// gather bucket, a sub-group of the update and the swap slot it passes through, or a buffer.
namespace op {
// Inside a block use:
struct Run {  // the model runs the block's pass, between begin_ and end_
  static constexpr ActionKind kind = ActionKind::run;
  bool operator==(const Run&) const = default;
};
struct Gather {  // all-gather the block's parameter shard into the parameter arena at arena_offset
  int block = -1;
  size_t arena_offset = 0;
  static constexpr ActionKind kind = ActionKind::gather;
  bool operator==(const Gather&) const = default;
};
struct Release {  // the block's gathered parameters return to the arena once compute is done
  int block = -1;
  static constexpr ActionKind kind = ActionKind::release;
  bool operator==(const Release&) const = default;
};
struct PlaceGrads {  // the block's gradient buffer goes to the gradient arena at arena_offset, zeroed
  int block = -1;
  size_t arena_offset = 0;
  static constexpr ActionKind kind = ActionKind::place_grads;
  bool operator==(const PlaceGrads&) const = default;
};
struct Accumulate {  // the block's gradient buffer is added into the f32 accumulator
  int block = -1;
  static constexpr ActionKind kind = ActionKind::accumulate;
  bool operator==(const Accumulate&) const = default;
};
struct ReleaseGrads {  // the block's gradient buffer returns to the arena once its last reader is done
  int block = -1;
  static constexpr ActionKind kind = ActionKind::release_grads;
  bool operator==(const ReleaseGrads&) const = default;
};
struct AllReduce {  // the bucket summed over ranks in place
  int bucket = -1;
  static constexpr ActionKind kind = ActionKind::all_reduce;
  bool operator==(const AllReduce&) const = default;
};
struct ReduceScatter {  // the bucket summed, this rank's slice into grad_shard (added to it, or cast)
  int bucket = -1;
  bool add = false;
  static constexpr ActionKind kind = ActionKind::reduce_scatter;
  bool operator==(const ReduceScatter&) const = default;
};
struct OffloadGrads {  // the bucket's reduced slice to the host, cast (or added) into grad_shard
  int bucket = -1;
  bool add = false;
  static constexpr ActionKind kind = ActionKind::offload_grads;
  bool operator==(const OffloadGrads&) const = default;
};
struct SumPartial {  // the bucket's partial gradients (PlannedBlock::tp_partial) summed over the
                     // tensor-parallel group, before its data-parallel reduction
  int bucket = -1;
  static constexpr ActionKind kind = ActionKind::sum_partial;
  bool operator==(const SumPartial&) const = default;
};
// The step's:
struct GradNorm {  // the squared norm of the reduce bucket's reduced gradients added up (then summed over ranks)
  int bucket = -1;
  bool sum_over_ranks = false;
  static constexpr ActionKind kind = ActionKind::grad_norm;
  bool operator==(const GradNorm&) const = default;
};
struct Update {  // the optimizer on the sub-group, its state in `slot` where it is swapped
  int sub_group = -1;
  int slot = 0;
  static constexpr ActionKind kind = ActionKind::update;
  bool operator==(const Update&) const = default;
};
struct UpdateNorms {  // first pass of a per-tensor update (Lamb) on the sub-group: the moments, and each
                      // tensor's squared norms of weights and update added into buffer tensor_norms
  int sub_group = -1;
  static constexpr ActionKind kind = ActionKind::update_norms;
  bool operator==(const UpdateNorms&) const = default;
};
struct SumNorms {  // the buffer summed in place over the ranks that split tensors: the data-parallel
                   // group (over_data_parallel) and the tensor-parallel group when there is one
  int buffer = -1;
  bool over_data_parallel = false;
  static constexpr ActionKind kind = ActionKind::sum_norms;
  bool operator==(const SumNorms&) const = default;
};
struct Zero {  // the buffer back to zero (also after a skipped step)
  int buffer = -1;
  static constexpr ActionKind kind = ActionKind::zero;
  bool operator==(const Zero&) const = default;
};
struct AllGather {  // the gather bucket: every rank's updated parameter slice to the full copies
  int bucket = -1;
  static constexpr ActionKind kind = ActionKind::all_gather;
  bool operator==(const AllGather&) const = default;
};
// Offload (the optimizer's state off the device):
struct SwapIn {  // the sub-group's state read from the swap files into the slot
  int sub_group = -1;
  int slot = 0;
  static constexpr ActionKind kind = ActionKind::swap_in;
  bool operator==(const SwapIn&) const = default;
};
struct SwapOut {  // the sub-group's updated state written from the slot back to the files
  int sub_group = -1;
  int slot = 0;
  static constexpr ActionKind kind = ActionKind::swap_out;
  bool operator==(const SwapOut&) const = default;
};
struct Upload {  // the sub-group's updated parameters (from the slot) copied to the device shard
  int sub_group = -1;
  int slot = 0;
  static constexpr ActionKind kind = ActionKind::upload;
  bool operator==(const Upload&) const = default;
};
}  // namespace op

struct Action {
  using Op = std::variant<op::Run, op::Gather, op::Release, op::PlaceGrads, op::Accumulate, op::ReleaseGrads, op::AllReduce,
                          op::ReduceScatter, op::GradNorm, op::Update, op::Zero, op::AllGather, op::UpdateNorms, op::SumNorms,
                          op::OffloadGrads, op::SwapIn, op::SwapOut, op::Upload, op::SumPartial>;
  Op op;
  int use = -1;    // ordinal of the block use it belongs to (-1: the step)
  int micro = -1;  // the use's key: micro-batch, block, pass
  int block = -1;
  Pass pass = Pass::forward;
  // A collective (gather, all_reduce, reduce_scatter) issued on the compute stream, in order with
  // the model's work, instead of on its own stream: compute waits for it and it for compute
  // (zero_optimization.overlap_comm = false, as DeepSpeed runs it on the default stream).
  bool serial = false;
  ActionKind kind() const { return static_cast<ActionKind>(op.index()); }
  template <class T>
  const T* as() const {
    return std::get_if<T>(&op);
  }
  bool operator==(const Action&) const = default;
};
inline constexpr size_t kActionKindCount = std::variant_size_v<Action::Op>;
// The enum tied to the variant: every alternative's index is a named kind, and the next one is none.
consteval bool action_kinds_counted() {
  for (size_t i = 0; i < kActionKindCount; ++i)
    if (action_name(static_cast<ActionKind>(i)) == "invalid") return false;
  return action_name(static_cast<ActionKind>(kActionKindCount)) == "invalid";
}
static_assert(action_kinds_counted(), "every ActionKind must be named in action_name");
template <size_t... I>
consteval bool ops_in_kind_order(std::index_sequence<I...>) {
  return ((std::variant_alternative_t<I, Action::Op>::kind == static_cast<ActionKind>(I)) && ...);
}
static_assert(ops_in_kind_order(std::make_index_sequence<kActionKindCount>{}),
              "Action::Op's alternatives must follow ActionKind's order");
// What an action acts on, as the plan JSON's "target" names it: its block, bucket, sub-group or
// buffer (-1 for run).
int action_target(const Action& a);

}  // namespace zeroth
