// The ZeRO engine (stages 0-3) on the block API. The model registers blocks; the engine plans
// (engine/plan/plan.h) and interprets the plan's programs (engine/executor/executor.h); it owns every
// parameter, gradient and optimizer byte.
//
//   for (micro, pass) in plan().passes:          the cycle's passes, in the planned order
//     forward:  for block in schedule.forward:   views = begin_forward(block, micro); forward on
//                                                views.params; end_forward(block, micro)
//     backward: for block in schedule.backward:  views = begin_backward(block, micro); backward,
//                                                ADDING into views.grads; end_backward(block, micro)
//   step()                                       after a backward pass; acts at the end of the cycle
//
// The model enqueues its work on compute_stream(); the engine orders communication against it
// with events. Gradient views start at zero each micro-batch (or hold the micro-batches so far,
// stages 0-1 in f32): a block used twice adds twice. The model multiplies its loss gradient by
// loss_gradient_scale() (the loss scale over the accumulation count).
#pragma once

#include <cstdint>     // int64_t
#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <optional>    // std::optional
#include <span>        // std::span
#include <vector>      // std::vector

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

#include "comm/communicator.h"                // Communicator
#include "comm/process_grid.h"                // ProcessGrid::Groups
#include "core/device.h"                      // Device, Stream
#include "engine/config/config.h"             // EngineConfig
#include "engine/executor/executor.h"         // SwapIo, Speculation, UpdateArgs
#include "engine/plan/plan.h"                 // Plan
#include "engine/executor/tier_allocators.h"  // TierAllocators
#include "models/block_api.h"                 // BlockHost, BlockSpec, BlockViews, ModelFootprint
#include "optim/loss_scaler.h"                // LossScaler

namespace zeroth {

class Executor;

struct StepResult {
  bool boundary = false;  // an optimizer step was due (the cycle was complete)
  bool skipped = false;   // the gradients held Inf/NaN: no update anywhere (f16: the scale dropped)
  int64_t step = 0;       // optimizer steps applied so far
  double grad_norm = 0;   // global L2 norm of the averaged, unscaled gradient, before clipping
  double lr = 0;          // the learning rate the step used
  double loss_scale = 1;  // the scale of the next micro-batch
  // With EngineConfig::time_breakdown (synchronizing): how long the step waited for the
  // gradient reductions still running after the last backward, and the rest of the step (norm,
  // update, post-step gathers).
  double reduce_wait_seconds = 0, update_seconds = 0;
  // Swap-file traffic of the cycle and step (offload to NVMe): bytes read and written since the
  // last step, and the time the engine's streams spent waiting on them (summed over streams).
  // update_seconds lasts until the step's last write-back has reached its file.
  uint64_t swap_read_bytes = 0, swap_write_bytes = 0;
  double swap_busy_seconds = 0;
  // The part of the swap bytes the optimizer moved (its sub-groups through their slots, the
  // parameters' write-backs): after the reductions, in update_seconds, or, for sub-groups updated
  // during the backward pass, there.
  uint64_t update_swap_read_bytes = 0, update_swap_write_bytes = 0;
  // The sub-groups updated during the backward pass (offload_optimizer.overlap_backward): their
  // result kept, or done again with the step's clipping, or undone for a skipped step.
  Speculation speculation = Speculation::none;
  // offload_optimizer.delayed_update: the step's update was left running under the next step,
  // whose forward and backward see the weights before it (false during the warm-up).
  bool update_delayed = false;
};

class Engine final : public BlockHost {
 public:
  // `dp`: the data-parallel group the state is partitioned over.
  Engine(Device& device, Communicator& dp, EngineConfig config);
  // A rank of a process grid: ZeRO partitions over its data-parallel group.
  Engine(Device& device, const ProcessGrid::Groups& groups, EngineConfig config);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int add_block(BlockSpec spec) override;
  // Optional; the default is registration order forward and its reverse backward.
  void set_schedule(BlockSchedule schedule) override;
  void set_chunk_schedules(std::vector<BlockSchedule> chunks) override;
  // Optional: the order of the cycle's passes (default: each micro-batch forward then backward).
  void set_pass_order(std::vector<PassRef> passes);
  // A pipeline stage (engine/pipeline/runner.h): the global gradient norm sums the squares over `stages`
  // (the pipeline group), and `tied_block` (>= 0 on the first and the last stage, -1 elsewhere) is
  // one copy of a parameter the two share, whose gradients are summed over the pair at each step,
  // counted in the norm on the first stage. Collective over `stages`; before finalize().
  void set_pipeline(Communicator& stages, int tied_block);
  // This rank's pipeline stage and their number (0 and 1 without set_pipeline), and the group of
  // the stages for collectives on the compute stream between cycles (checkpoints), or null.
  // A tensor-parallel rank: the blocks' parameters declare their split over `tensor`
  // (ParamSpec::tp); the global norm sums over it (replicated parameters counted on its rank 0), and
  // partial gradients are summed over it before each data-parallel reduction. Collective over
  // `tensor`; before finalize().
  void set_tensor_parallel(Communicator& tensor);
  int tensor_rank() const { return tensor_comm_ ? tensor_comm_->rank() : 0; }
  int tensor_ranks() const { return tensor_comm_ ? tensor_comm_->size() : 1; }
  // The tensor-parallel group for collectives on the compute stream between cycles (checkpoints), or null.
  Communicator* tensor_comm() { return tensor_comm_.get(); }
  int pipeline_stage() const { return stage_comm_ ? stage_comm_->rank() : 0; }
  int pipeline_stages() const { return stage_comm_ ? stage_comm_->size() : 1; }
  Communicator* stage_comm() { return stage_comm_.get(); }
  // Plans, checks the plan and the model's footprint against the budgets (nothing is allocated
  // when they do not fit), allocates and initializes. Collective.
  void finalize(const ModelFootprint& model = {});
  // The same with a plan the caller made (make_plan on the registered blocks, schedule and
  // config, for this rank), so a run plans once. Without `initialize_values` the parameters are
  // left for the caller to set before the first step (a checkpoint's load, set_block_values on
  // every block), which saves the seeded initialization of every parameter.
  void finalize(Plan plan, const ModelFootprint& model = {}, bool initialize_values = true);

  const Plan& plan() const { return plan_; }
  const EngineConfig& config() const { return config_; }
  const BlockSpec& block_spec(int block) const { return specs_.at(block); }
  Device& device() override { return device_; }
  // From the pinned_host tier, within run.host_memory.
  Buffer allocate_host(size_t bytes, MemTag tag) override { return tiers_.allocate(Tier::pinned_host, bytes, tag); }
  // The engine's collectives travel on communicators split from `dp` at finalize(), so the
  // caller may keep using `dp` on its own streams.
  Communicator& comm() { return comm_; }
  CommStats comm_stats() const;  // what the engine's own collectives moved so far
  Stream& compute_stream() override { return device_.default_stream(); }
  // The one precision: the config's, which the plan is made from (finalize checks they agree).
  DType compute_dtype() const override { return config_.compute_dtype; }
  double loss_gradient_scale() const override;
  double loss_scale() const { return scaler_.scale(); }
  int micro_batches_in_flight() const override;
  int chunk_micro_batches_in_flight(int chunk) const override;
  int64_t steps_applied() const { return applied_; }
  // What each tier's allocator holds (device: the device's own accounting).
  MemoryStats tier_stats(Tier tier) const { return tiers_.stats(tier); }
  // What the engine moved through swap files so far (offload to NVMe).
  SwapIo swap_io() const;
  uint64_t swap_disk_bytes() const;  // Executor::swap_disk_bytes

  const BlockViews& begin_forward(int block, int micro) override;
  void end_forward(int block, int micro) override;
  const BlockViews& begin_backward(int block, int micro) override;
  void end_backward(int block, int micro) override;
  void begin_evaluation() override;
  void end_evaluation() override;
  StepResult step();

  // The fp32 master values of a block's parameters, whole (padded), on the host. Collective
  // over the data-parallel group; synchronizes.
  std::vector<float> master_values(int block);
  // The same into `out`, whose memory is reused when it is large enough: a caller going block by
  // block touches fresh pages once, not per block (first touches run at 0.5-2 GB/s on some VMs).
  void master_values(int block, std::vector<float>& out);
  // Replaces a block's fp32 master values (and the parameters computed from them) with `values`:
  // the block's parameters in order, padded or not. Every rank passes the same values; the
  // optimizer state is kept. Between cycles only.
  void set_master_values(int block, std::span<const float> values);

  // What checkpoints (engine/checkpoint/checkpoint.h) read and restore, between cycles, synchronously, with
  // no collective (each first publishes a delayed update still running, offload_optimizer.delayed_update,
  // so it sees every update applied so far):
  // - the rank's owned range of an f32 kind of state (master, moment0, moment1: plan().range());
  void read_owned(StateKind kind, int block, std::span<float> out);
  void write_owned(StateKind kind, int block, std::span<const float> values);
  // - a block's master values and every copy computed from them: fill(lo, hi, out) provides padded
  //   elements [lo, hi) in f32, asked for in consecutive chunks of at most kTransferChunkNumel that
  //   cover plan().values_range(block); `out` is zero outside the block's parameters (alignment
  //   gaps, padding), and fill writes every parameter element of [lo, hi) (what was there before
  //   is undefined);
  void set_block_values(int block, const std::function<void(size_t, size_t, float*)>& fill);
  // - a block's values as a fresh run starts them (its parameters' InitRule, the seed, the names):
  //   the blocks a loader's source does not hold (LoRA adapters over Hugging Face weights);
  void initialize_block(int block);
  // - where a loader may write those values, and an owned moment range, straight into
  //   host memory instead (Executor::values_in_place and owned_in_place): nullptr where
  //   set_block_values or write_owned is needed. The engine counts as written from then on.
  float* values_in_place(int block);
  float* owned_in_place(StateKind kind, int block);
  // - an owned master or moment range where it lies in host memory as f32, to read (a save's
  //   copy source instead of read_owned); nullptr elsewhere. Between cycles.
  const float* owned_in_host(StateKind kind, int block) const;
  // - the host buffers those calls reuse from block to block, freed when a series is over.
  void release_transfer_buffers();
  size_t transfer_buffer_bytes() const;  // what they hold now: 0 after finalize() and after a release
  // - whether the engine holds exactly what finalize() gave it (no step run, no value written): a
  //   loader may then write it as a checkpoint streams in, and put it back with reinitialize() (the
  //   values and zeroed state finalize() gave, written again, in swap files too; zeros for values
  //   finalize() left to the caller; the counters and loss scale at their start) when a file
  //   fails to verify;
  bool pristine() const { return pristine_; }
  void reinitialize();
  // - the counters and the loss scaler a resumed run continues from.
  int64_t steps_run() const { return cycles_; }  // optimizer steps run, skipped ones included
  nlohmann::json counters() const;
  void restore_counters(const nlohmann::json& counters);

 private:
  Executor& running(const char* what, int block) const;
  Executor& between_cycles(const char* what, int block) const;
  SwapIo swap_io_{};  // the executor's totals at the last step
  void initialize(bool values);
  void write_initial_values(int block);

  Device& device_;
  Communicator& comm_;
  EngineConfig config_;
  TierAllocators tiers_;
  std::vector<BlockSpec> specs_;
  std::vector<BlockSchedule> schedules_;  // per model chunk; empty: the default schedule
  std::vector<PassRef> passes_;
  Plan plan_;
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<Communicator> stage_comm_, tie_comm_, tensor_comm_, tensor_reduce_comm_;
  int tied_block_ = -1;
  LossScaler scaler_;
  int64_t applied_ = 0;  // optimizer steps applied
  // Whether the next cycle updates offloaded sub-groups during its backward pass with the
  // arguments of an unclipped step: after a step that was neither clipped nor skipped (a step that
  // was is likely followed by another, whose speculative work would be done twice).
  bool speculate_ = true;
  bool values_initialized_ = false;  // finalize() wrote the initial values
  bool pristine_ = false;
  // The update's arguments for the next step, its summed gradients multiplied by `grad_scale`
  // (1 / (loss scale x ranks) to average and unscale them, times the clipping factor).
  UpdateArgs update_args(double grad_scale) const;
  int64_t cycles_ = 0;  // steps run, skipped ones included
};

}  // namespace zeroth
