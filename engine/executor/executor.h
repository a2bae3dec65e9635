// The executor: the rank's buffers, allocated per the plan on their tiers, and the interpreter of
// the plan's programs. It holds no decision of its own: what is gathered, placed, reduced,
// released and updated, and when, is in the actions; the executor only knows how to do each kind.
//
// Three streams: compute (the model's, the device's default), gather (parameter all-gathers) and
// reduce (gradient reductions); events order them, so gathers, reductions and compute overlap.
// A collective the plan marks serial runs on the compute stream instead, in order with compute.
#pragma once

#include <array>        // std::array
#include <atomic>       // std::atomic
#include <exception>    // std::exception_ptr
#include <mutex>        // std::mutex
#include <cstdint>      // int64_t
#include <functional>   // std::function
#include <memory>       // std::unique_ptr, std::shared_ptr
#include <optional>     // std::optional
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "comm/communicator.h"                // Communicator
#include "core/device.h"                      // Device, Stream, Event, Buffer
#include "engine/config/config.h"             // EngineConfig
#include "engine/plan/plan.h"                 // Plan, Action
#include "engine/executor/arena.h"            // Arena
#include "engine/executor/swap_files.h"       // SwapFiles, SwapIo
#include "engine/executor/tier_allocators.h"  // TierAllocators
#include "models/block_api.h"                 // BlockSpec, BlockViews
#include "offload/aligned_buffer.h"           // offload::AlignedBuffer

namespace zeroth {

// What the step passes to the update actions.
struct UpdateArgs {
  int64_t step = 1;  // 1-based
  double lr = 0;
  float grad_scale = 1;                        // unscaling, averaging and clipping in one factor
  std::optional<std::array<double, 2>> betas;  // the schedule's (OneCycle's cycle_momentum), else the optimizer's
  bool operator==(const UpdateArgs&) const = default;
};

// What became of the sub-groups updated during the backward pass (Plan::in_backward) at the step:
// none were, the step's arguments were those they were updated with (committed), or they were not
// (the step clipped: updated again; or skipped: their parameters put back).
enum class Speculation : uint8_t { none, committed, redone, restored };
constexpr std::string_view speculation_name(Speculation s) {
  switch (s) {
    case Speculation::none: return "none";
    case Speculation::committed: return "kept";
    case Speculation::redone: return "redone";
    case Speculation::restored: return "undone";
  }
  return "?";
}

// A rank's groups beyond its data-parallel one. On the compute stream at the step: the squares of
// the global norm are summed over `stages` and `tensor`, the tied block's gradients over `tied`
// (the first and the last stage of this data-parallel index). On the reduce stream: partial
// gradients summed over `tensor_reduce` (the ranks of `tensor`, its own communicator so the two
// streams never share one). Null: none.
struct GroupLinks {
  Communicator* stages = nullptr;
  Communicator* tied = nullptr;
  Communicator* tensor = nullptr;
  Communicator* tensor_reduce = nullptr;
};

class Executor {
 public:
  Executor(Device& device, TierAllocators& tiers, Communicator& dp, const Plan& plan, const std::vector<BlockSpec>& specs,
           const EngineConfig& config, GroupLinks links = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  Stream& compute_stream() { return device_.default_stream(); }
  CommStats comm_stats() const;
  SwapIo swap_io() const { return swaps_.io(); }
  // What the file system allocated to this rank's swap files (st_blocks): their disk use as the
  // kernel counts it.
  uint64_t swap_disk_bytes() const { return swaps_.disk_bytes(); }
  // Raises the first swap-file transfer that failed on a stream, if any (the step calls it).
  void check_io() const { swaps_.check(); }
  // Waits until the swaps and uploads enqueued so far are done (a timed step's end).
  void drain_swaps();

  // The block uses, checked against the program (the training cycle, or the evaluation pass).
  const BlockViews& begin(int block, int micro, Pass pass, const char* what);
  void end(int block, int micro, Pass pass, const char* what);
  void begin_evaluation();
  void end_evaluation();
  bool evaluating() const { return evaluating_; }
  // Where the walk is: at the start of the cycle, right after a backward pass, or at its end.
  bool at_cycle_start() const { return cursor_ == 0; }
  bool after_backward_pass() const;
  bool cycle_complete() const { return cursor_ == plan_.program.size(); }
  size_t uses_done() const;

  // The step phase. grad_norm(): the squared global norm of the reduced gradients (waits for the
  // reductions; synchronizes). finish_step(): with args, the update, clearing and post-step
  // gather actions; without (a skipped step), the clearing ones only. Rewinds the cycle.
  // Blocks the host until the cycle's gradient reductions are done.
  void wait_for_reductions();
  double grad_norm();
  // With Plan::delayed_update, `delay` leaves the update running in the background (on the
  // update and swap streams) under the next cycle, whose forward and backward see the parameters
  // before it, and publishes the update left running by the step before (uploads, post-step
  // gathers); without, the update is run and published at once (the warm-up).
  Speculation finish_step(const std::optional<UpdateArgs>& args, bool delay = false);
  // Publishes a delayed update still pending and waits for it, or for a sweep published by
  // sub-group: what reads or writes the state between steps sees every update applied so far.
  void settle();
  bool update_pending() const { return pending_; }
  // The arguments a cycle's sub-groups are updated with during the backward pass, asked for once
  // per cycle before the first of them (nullopt: wait for the step instead): the step's own when it
  // is neither clipped nor skipped.
  void set_speculation(std::function<std::optional<UpdateArgs>()> args) { speculation_ = std::move(args); }

  // Values of a block: fill(lo, hi, out) provides padded elements [lo, hi) in f32, a chunk of at most
  // kTransferChunkNumel of Plan::values_range at a time, front to back; every kind
  // this rank holds of the block (full parameters, parameter shard, master) is written from them,
  // so no collective is needed. `out` holds zeros outside the block's parameters (the alignment
  // gaps between them and the padding after) and anything inside: fill writes every parameter
  // element in [lo, hi). It may be the full parameters' own memory (f32 on the host). Between
  // cycles; synchronizes.
  void write_block(int block, const std::function<void(size_t, size_t, float*)>& fill);
  // Host memory a writer may fill directly, between cycles, instead of going through write_block
  // or write_owned: a block's values [Plan::values_range) where write_block would write them in
  // place and nowhere else (f32 full parameters on the host that hold the shard and master too),
  // and an f32 owned range held in host memory. nullptr where those calls are needed.
  // Elements [lo, hi) of block b that no parameter holds, zeroed in `values` (element lo first).
  void zero_outside_params(int b, size_t lo, size_t hi, float* values) const;
  float* values_in_place(int block);
  float* owned_in_place(const OwnedRange& r) const;
  // Whether a buffer is memory this process can write: not a swap file, not a GPU's.
  bool in_host_memory(int buffer) const;
  // Zeroes what starts at zero (moments, gradient accumulators).
  void start();
  // The f32 values of the rank's part of a block (Plan::values_owned): its master, or a frozen
  // block's parameter shard widened.
  void read_values(int block, float* out);
  // The fp32 master values of a block, whole (padded): a frozen block's parameters widened.
  // Collective over the group; synchronizes.
  // `out` is resized to the padded block; its memory is reused where it is large enough.
  void master_values(int block, std::vector<float>& out);
  // A whole owned range (in its buffer's dtype) to or from host memory, whatever its tier (between
  // steps; synchronous).
  void read_owned(const OwnedRange& r, void* out);
  void write_owned(const OwnedRange& r, const void* values);
  // The host buffers write_block, read_owned and write_owned reuse from call to call (a block at a
  // time: touching fresh memory costs seconds per GiB on some machines, so a checkpoint's blocks
  // share them), freed here once a series of calls is over.
  void release_scratch();
  size_t scratch_bytes() const;  // what the transfer scratch holds now (capacity)

 private:
  void register_io_buffers();
  void execute(const Action& a);
  // The tied block's reduced gradients summed with the other stage's copy (the step's first work).
  void tie_gradients();
  // The squares of a reduce bucket's reduced gradients on the device added into `out` (the tied
  // block left out where the other copy counts).
  void bucket_sum_squares(int bucket, float* out, bool accumulate);
  const Action& expect_run(size_t at, int block, int micro, Pass pass, const char* what) const;
  std::shared_ptr<Event> record(Stream& stream);
  void gather(int block, size_t arena_offset, Stream& gs);
  void release(int block);
  void place_grads(int block, size_t arena_offset);
  void release_grads(int block);
  void all_reduce(int bucket, Stream& rs);
  void reduce_scatter(int bucket, bool add, Stream& rs);
  void sum_partial(int bucket, Stream& rs);
  // Lamb's per-tensor norms over the ranks that split the tensors: the data-parallel group when
  // the plan says so (its shards split them), the tensor-parallel group when there is one.
  void sum_tensor_norms(bool over_data_parallel);
  void all_gather(int bucket);
  void update(int sub_group, int slot, const UpdateArgs& args);
  void update_norms(int sub_group, const UpdateArgs& args);
  void offload_grads(int bucket, bool add, Stream& rs);
  void swap_in(int sub_group, int slot);
  // Writes the sub-group's state to the copy the last step did not write (files with two copies):
  // that copy becomes the current one at once, or, speculative, when the step commits.
  void swap_out(int sub_group, int slot, bool speculative = false);
  void upload(int sub_group, int slot);
  // The sub-group's parameters from its master weights as they were (a skipped step after a
  // speculative update), for upload.
  void restore(int sub_group, int slot);
  // The step program's sweep (swap_in, update, swap_out, zeroing) with `args` (none: the zeroing
  // only), and its publication (uploads and post-step gathers of a pending update), for plans with
  // delayed_update. The gather stream waits for the update stream's work so far either way.
  void launch_update(const std::optional<UpdateArgs>& args);
  void publish_update();
  // A swap_in, update, upload or swap_out of the cycle's program: with this cycle's speculative
  // arguments, if there are.
  void speculate(const Action& a);
  // Writes an owned range front to back in consecutive runs of its elements (values in its
  // buffer's dtype): a copy into memory, or into the swap file through `bounce`, a write whenever
  // it fills or a piece ends. finish() writes what is left.
  class OwnedWriter {
   public:
    OwnedWriter(Executor& exec, const OwnedRange& r, offload::AlignedBuffer& bounce);
    // Elements [lo, hi) of the block, the part of them inside the range (none is fine).
    void add(const void* values, size_t lo, size_t hi);
    void finish();

   private:
    void flush();
    Executor& exec_;
    const OwnedRange& r_;
    offload::AlignedBuffer& bounce_;
    size_t element_;  // the range's element size
    size_t next_;     // the next element of the range to write
    std::vector<SwapFiles::Piece> pieces_;
    size_t piece_ = 0, done_ = 0;  // the current piece, and its elements in the file or the bounce buffer
    size_t filled_ = 0;            // bytes in the bounce buffer, for the current piece
  };
  // A sub-group's spans as optimizer steps, [0] without weight decay and [1] with, and where each
  // span's tensor norms are (null when the spans name no tensor).
  struct SubGroupSteps {
    OptimizerParams params[2];
    std::array<std::vector<OptimizerStep>, 2> steps;
    std::array<std::vector<float*>, 2> norms;
  };
  SubGroupSteps sub_group_steps(int sub_group, int slot, const UpdateArgs& args) const;

  bool on_device(int buffer) const { return plan_.buffers[buffer].tier == Tier::device; }
  // Where the update reads and writes element `element` of a block's state of `kind`: in its
  // buffer, or in swap slot `slot` when the buffer is a swap file.
  void* state_at(StateKind kind, int block, size_t element, int sub_group, int slot) const;
  // Where a sub-group's updated narrow parameters wait for upload (param_out), or nullptr.
  void* param_out_at(int sub_group, int slot, const OwnedRange& master, size_t element) const;
  // All-gathers a block's parameter shards into `full` on the device, bringing this rank's shard
  // from the host or its swap file first when it lives there.
  void gather_shards(Stream& gs, int block, TensorView full);

  void* at(const OwnedRange& r, size_t element) const;  // where element `element` of the block is
  TensorView view(StateKind kind, int block) const;     // the whole owned range
  TensorView buffer_view(int buffer) const;
  TensorView full_params(int block) const;
  TensorView grad_view(int block) const;       // where the model adds the block's gradients
  TensorView reduced_grads(int bucket) const;  // a reduce bucket's reduced gradients (grad_shard)

  Device& device_;
  const Plan& plan_;
  const std::vector<BlockSpec>& specs_;
  const EngineConfig& config_;
  std::unique_ptr<Stream> gather_stream_, reduce_stream_;
  // One communicator per stream: collectives of one communicator must run in the same order on
  // every rank, which two streams running concurrently would not guarantee.
  std::unique_ptr<Communicator> gather_comm_, reduce_comm_, step_comm_;
  // The same over the expert-data-parallel group (Plan::ep > 1), for expert blocks.
  std::unique_ptr<Communicator> expert_gather_comm_, expert_reduce_comm_, expert_step_comm_;
  Communicator& gather_comm(int block) const { return plan_.blocks[block].expert ? *expert_gather_comm_ : *gather_comm_; }
  Communicator& reduce_comm(int block) const { return plan_.blocks[block].expert ? *expert_reduce_comm_ : *reduce_comm_; }
  Communicator& step_comm(int block) const { return plan_.blocks[block].expert ? *expert_step_comm_ : *step_comm_; }
  GroupLinks links_;
  std::vector<Buffer> buffers_;  // as plan.buffers
  Arena param_arena_, grad_arena_;
  std::vector<void*> gathered_;  // where each block's full parameters are now
  std::vector<std::unique_ptr<Event>> gathered_event_;
  std::vector<bool> gather_pending_;                 // compute must wait for the block's gather
  std::vector<void*> grads_;                         // where each block's gradients are added now
  std::vector<std::shared_ptr<Event>> grad_reader_;  // the last work that read them
  std::vector<BlockViews> views_;
  std::shared_ptr<Event> reduced_;  // the last bucket's reduction
  // Offload: the swap files; the streams that read and write them; per reduce bucket, where its
  // reduced slice waits on the device and the sum of squares of its offloaded gradients; per slot,
  // when its read is complete, when the last write and upload from it are done.
  SwapFiles swaps_;
  std::unique_ptr<Stream> swap_in_stream_, swap_out_stream_;
  std::vector<TensorView> landing_;
  std::vector<double> bucket_sumsq_;
  // The writes of the two gradient pieces in grad_host; touched only by offload_grads' host
  // callbacks, which run one at a time on one stream.
  std::array<offload::IoHandle, 2> grad_writes_;
  std::vector<std::unique_ptr<Event>> slot_ready_, slot_written_, slot_uploaded_;
  // The offloaded sub-groups' updates and uploads run on their own stream, so that those of the
  // backward pass run beside its compute.
  std::unique_ptr<Stream> update_stream_;
  // Per sub-group: whether this cycle wrote the other copy of its two-copy files speculatively.
  std::vector<bool> speculated_;
  // Delayed update: one has been launched and not yet published; per sub-group, when the launch
  // has read its gradients (the next cycle's offload_grads of its buckets wait for that), and the
  // sub-groups each reduce bucket's gradients feed.
  bool pending_ = false;
  std::vector<std::unique_ptr<Event>> grads_read_;
  std::vector<std::vector<int>> bucket_sub_groups_;
  // Plan::publish_by_sub_group: per sub-group, when its last upload is done; per block, the
  // offloaded sub-groups that hold its elements (what a gather of it waits for).
  std::vector<std::unique_ptr<Event>> published_;
  std::vector<std::vector<int>> block_sub_groups_;
  void wait_published(Stream& s, int block);
  std::function<std::optional<UpdateArgs>()> speculation_;
  std::optional<UpdateArgs> speculative_args_;
  bool speculation_asked_ = false;
  std::vector<float> scratch_values_;
  std::vector<char> scratch_narrow_;
  offload::AlignedBuffer scratch_io_[2];  // bounce buffers: write_block writes two ranges at once
  // Floats of master_values' device buffer (the owned range, then the whole block) for the plan's
  // largest gather: asked for at that size for every block, the CPU device's cache hands the same
  // block back, where each block size would leave a cached allocation of its own.
  size_t gather_numel_ = 0;
  size_t cursor_ = 0;  // next action of the program being walked
  int open_use_ = -1;  // the use between its begin_ and end_
  size_t eval_cursor_ = 0;
  bool evaluating_ = false;
};

}  // namespace zeroth
