// The ZeRO engine (stages 0-3) on the block API. The model registers blocks, then per micro-step
// walks them between begin_/end_forward and begin_/end_backward and calls step(); the engine owns
// every parameter, gradient and optimizer byte and decides, through its plan, what is gathered,
// released and reduced where.
//
//   for block in schedule.forward:   views = engine.begin_forward(b); forward on views.params; engine.end_forward(b)
//   for block in schedule.backward:  views = engine.begin_backward(b); backward, ADDING into views.grads;
//                                    engine.end_backward(b)
//   engine.step()                    every micro-step; acts at the accumulation boundary
//
// The model enqueues its work on compute_stream(); the engine orders communication against it
// with events, so gathers, reductions and compute overlap. Gradient views start at zero each
// micro-step (or hold the micro-steps so far, stages 0-1 in f32): a block used twice adds twice.
// The model multiplies its loss gradient by loss_scale().
#pragma once

#include <cstdint>  // int64_t
#include <functional>  // std::function
#include <memory>   // std::unique_ptr
#include <span>     // std::span
#include <string>   // std::string
#include <vector>   // std::vector

#include "comm/communicator.h"  // Communicator
#include "core/device.h"        // Device, Stream, Event, Buffer
#include "engine/config.h"      // EngineConfig
#include "engine/plan.h"        // Plan
#include "models/block_api.h"   // BlockHost, BlockSpec, BlockViews
#include "optim/loss_scaler.h"  // LossScaler

namespace zeroth {

struct StepResult {
  bool boundary = false;  // an optimizer step was due at this micro-step
  bool skipped = false;   // the gradients held Inf/NaN: no update anywhere (f16: the scale dropped)
  int64_t step = 0;       // optimizer steps applied so far
  double grad_norm = 0;   // global L2 norm of the averaged, unscaled gradient, before clipping
  double lr = 0;          // the learning rate the step used
  double loss_scale = 1;  // the scale of the next micro-step
};

class Engine final : public BlockHost {
 public:
  Engine(Device& device, Communicator& dp, EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int add_block(BlockSpec spec) override;
  // Optional; the default is registration order forward and its reverse backward.
  void set_schedule(BlockSchedule schedule) override;
  // Builds the plan, checks it against the device budget, allocates and initialises. Collective.
  void finalize();

  const Plan& plan() const { return plan_; }
  const EngineConfig& config() const { return config_; }
  const BlockSpec& block_spec(int block) const { return specs_.at(block); }
  Device& device() override { return device_; }
  // The engine's collectives travel on communicators split from `dp` at finalize(), so the
  // caller may keep using `dp` on its own streams.
  Communicator& comm() { return comm_; }
  // What the engine's own collectives moved so far.
  CommStats comm_stats() const;
  Stream& compute_stream() override { return device_.default_stream(); }
  DType compute_dtype() const override { return config_.compute_dtype; }
  double loss_scale() const override { return scaler_.scale(); }
  int64_t steps_applied() const { return applied_; }

  const BlockViews& begin_forward(int block) override;
  void end_forward(int block) override;
  const BlockViews& begin_backward(int block) override;
  void end_backward(int block) override;
  void begin_evaluation() override;
  void end_evaluation() override;
  StepResult step();

  // The fp32 master values of a block's parameters, whole (padded), on the host. Collective
  // over the data-parallel group; synchronizes.
  std::vector<float> master_values(int block);
  // Replaces a block's fp32 master values (and the parameters computed from them) with `values`:
  // the block's parameters in order, padded or not. Every rank passes the same values; the
  // optimizer state is kept. Between steps only.
  void set_master_values(int block, std::span<const float> values);

 private:
  struct Released {
    size_t offset, length;
    std::shared_ptr<Event> done;
  };
  struct Arena {
    Buffer buffer;
    std::vector<Released> released;
  };

  const PlannedUse& enter(int block, bool backward, const char* what);
  void leave(int block, bool backward, const char* what);
  void place(Arena& arena, size_t offset, size_t length, Stream& writer);
  void release(Arena& arena, size_t offset, size_t length, Stream& last_user);
  void gather_block(int block, size_t arena_offset);
  void release_gathered(int block);            // stage 3: back to the arena once compute is done with it
  void release_params(const PlannedUse& use);  // stage 3: the blocks this use lets go of
  void fire_bucket(int bucket);
  void gather_after_step();
  void apply_optimizer(int64_t t, double lr, float grad_scale);
  void initialise();
  // Writes the part of block b's values that this rank holds; fill(lo, hi, out) provides padded
  // elements [lo, hi) of the block.
  void write_block(int b, const std::function<void(size_t, size_t, float*)>& fill);
  void check_budget() const;
  TensorView full_params(int block) const;
  TensorView grad_view(int block) const;    // where the model adds the block's gradients
  TensorView accumulated(int block) const;  // stages 0-1: the block in the f32 accumulator
  float* master_shard(int block) const;     // this rank's fp32 master values of the block
  std::shared_ptr<Event> record(Stream& stream);

  Device& device_;
  Communicator& comm_;
  EngineConfig config_;
  std::vector<BlockSpec> specs_;
  BlockSchedule schedule_;
  bool schedule_set_ = false;
  Plan plan_;
  bool finalized_ = false;
  bool evaluating_ = false;

  std::unique_ptr<Stream> gather_stream_, reduce_stream_;
  std::unique_ptr<Communicator> gather_comm_, reduce_comm_, step_comm_;  // split from comm_, one per stream
  Buffer params_full_;     // stages 0-2: every block; stage 3: persistent blocks
  Buffer param_shard_;     // stage 3
  Buffer master_;          // when the master weights are not the parameters themselves
  Buffer state_[2];
  Buffer grad_accum_;      // stages 0-1: f32, every block
  Buffer grad_shard_;      // stages 1-3: f32, this rank's shard
  Arena param_arena_, grad_arena_;
  Buffer reduce_staging_, gather_staging_, scalar_;
  std::vector<size_t> persistent_offset_;
  std::vector<void*> gathered_;                   // stage 3: where each block's full parameters are now
  std::vector<std::unique_ptr<Event>> gathered_event_;
  std::vector<size_t> grad_offset_;               // in the gradient arena, while placed
  std::vector<std::shared_ptr<Event>> grad_reduced_;  // stages 2-3: the reduction that read them
  std::vector<BlockViews> views_;
  std::shared_ptr<Event> reduced_;                // the last bucket's reduction

  LossScaler scaler_;
  size_t pos_ = 0;          // next use in plan_.uses
  int64_t micro_ = 0;       // micro-step within the accumulation cycle
  int64_t applied_ = 0;     // optimizer steps applied
};

}  // namespace zeroth
