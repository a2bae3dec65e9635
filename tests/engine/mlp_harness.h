// The equivalence harness: trains the MLP on one rank of a data-parallel group and reports what
// the tests compare across stages, world sizes and backends. Every step's global batch is the
// same whatever the world: rank r's micro-batch m holds rows [(r * gas + m) * mb, ... + mb).
#pragma once

#include <array>       // std::array
#include <cmath>       // std::sin
#include <functional>  // std::function
#include <limits>      // std::numeric_limits
#include <map>         // std::map
#include <mutex>       // std::mutex
#include <optional>    // std::optional
#include <random>      // std::mt19937
#include <string>      // std::string
#include <vector>      // std::vector

#include "comm/communicator.h"
#include "comm/local/local_comm.h"
#include "comm/process_grid.h"
#include "core/device.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/engine.h"
#include "models/mlp/mlp.h"

namespace zeroth::testing {

struct MlpRun {
  int stage = 0;
  int gas = 1;
  DType dtype = DType::f32;
  int steps = 4;
  int global_batch = 24;
  std::vector<int> widths = {16, 32, 32, 8};
  size_t memory_budget = 0;
  // Applied to the config after the defaults below.
  std::function<void(EngineConfig&)> tweak;
  // Multiplies one rank's targets on one step by Inf (to inject an overflow).
  int poison_rank = -1, poison_step = -1;
  // Every micro-batch of a rank takes the rows of its first one (the accumulated gradient is
  // then gas times one micro-batch's).
  bool repeat_first_micro = false;
  // Wait for each step on the host before the next; false: only at the end (losses read then).
  bool synchronize_steps = true;
  // Checkpoints: `resume` (a checkpoint or step folder) is loaded after finalize and the run
  // continues from its step (losses, steps and weights then cover the steps it ran); after
  // `save_after` steps in all, the state is saved into `checkpoint_dir`.
  std::string resume, checkpoint_dir;
  int save_after = -1;
  // Called on every rank once the run's state is set (after a resume) and after every step, with
  // the number of steps done.
  std::function<void(Engine&, int)> inspect;
  // When set, the model computes step k (0-based) with the parameters step k - 1 computed with
  // wherever this returns true, given the step results so far (a serial engine fed stale parameters).
  std::function<bool(int, const std::vector<StepResult>&)> stale_params;
};

// A host that hands the model the parameters of the step before instead of the engine's, on the
// steps it is told to: the engine's own serial step then applies each update one step late.
class StaleParams final : public BlockHost {
 public:
  explicit StaleParams(Engine& engine) : engine_(engine) {}
  // Before each step's first block use.
  void next_step(bool stale) {
    stale_ = stale;
    std::swap(now_, before_);
    taken_.assign(taken_.size(), false);
  }
  int add_block(BlockSpec spec) override { return engine_.add_block(std::move(spec)); }
  void set_schedule(BlockSchedule schedule) override { engine_.set_schedule(std::move(schedule)); }
  const BlockViews& begin_forward(int block, int micro) override { return substitute(block, engine_.begin_forward(block, micro)); }
  void end_forward(int block, int micro) override { engine_.end_forward(block, micro); }
  const BlockViews& begin_backward(int block, int micro) override { return substitute(block, engine_.begin_backward(block, micro)); }
  void end_backward(int block, int micro) override { engine_.end_backward(block, micro); }
  int micro_batches_in_flight() const override { return engine_.micro_batches_in_flight(); }
  void begin_evaluation() override { engine_.begin_evaluation(); }
  void end_evaluation() override { engine_.end_evaluation(); }
  Stream& compute_stream() override { return engine_.compute_stream(); }
  Device& device() override { return engine_.device(); }
  Buffer allocate_host(size_t bytes, MemTag tag) override { return engine_.allocate_host(bytes, tag); }
  DType compute_dtype() const override { return engine_.compute_dtype(); }
  double loss_gradient_scale() const override { return engine_.loss_gradient_scale(); }

 private:
  // The step's parameters are copied at the block's first use (on the compute stream, after the
  // engine's gathers); a stale step computes with the copy the step before made.
  const BlockViews& substitute(int block, const BlockViews& v) {
    const size_t b = static_cast<size_t>(block);
    if (b >= views_.size()) {
      views_.resize(b + 1), now_.resize(b + 1), before_.resize(b + 1), taken_.resize(b + 1, false);
    }
    if (!taken_[b]) {
      now_[b].resize(v.params.size());
      for (size_t i = 0; i < v.params.size(); ++i) {
        now_[b][i].resize(v.params[i].bytes());
        engine_.device().copy(engine_.compute_stream(), now_[b][i].data(), v.params[i].data, v.params[i].bytes());
      }
      taken_[b] = true;
    }
    views_[b] = v;
    for (size_t i = 0; stale_ && i < v.params.size(); ++i) views_[b].params[i].data = before_[b].at(i).data();
    return views_[b];
  }

  Engine& engine_;
  bool stale_ = false;
  std::vector<BlockViews> views_;
  std::vector<std::vector<std::vector<char>>> now_, before_;  // [block][parameter] bytes
  std::vector<bool> taken_;
};

struct RankResult {
  std::vector<double> losses;               // per step: mean of this rank's micro-batch losses
  std::vector<StepResult> steps;            // the boundary step results
  std::vector<std::vector<float>> weights;  // per block: the fp32 master values after training
  std::array<size_t, kMemTagCount> peak{};  // measured on the rank's device
  std::array<size_t, kMemTagCount> planned{};
  uint64_t comm_bytes_per_step = 0;  // logical bytes the engine's collectives moved in the last step
  double final_loss_scale = 1;
  std::array<size_t, kTierCount> tier_bytes{};  // the plan's bytes per tier
  SwapIo swap_io;                               // what went through swap files
  int device_buckets = 0, reduce_buckets = 0;   // the plan's reduce buckets, and those whose optimizer state stays on the device
};

inline EngineConfig mlp_config(const MlpRun& run) {
  EngineConfig c;
  c.zero.stage = run.stage;
  c.zero.reduce_bucket_size = 1200;  // two buckets for the default widths: both single and staged paths
  c.zero.allgather_bucket_size = 1200;
  c.zero.stage3_prefetch_bucket_size = 2000;
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.stage3_max_reuse_distance = 0;
  c.zero.overlap_comm = true;
  c.compute_dtype = run.dtype;
  c.gradient_accumulation_steps = run.gas;
  c.gradient_clipping = 1.0;
  c.optimizer.kind = OptimizerKind::adamw;
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.01;
  c.schedule.kind = ScheduleKind::warmup;
  c.schedule.warmup_min_lr = 1e-3;  // not 0: steps 1 and 2 (the constructor's lr, iteration 0) move the weights too
  c.schedule.warmup_max_lr = 1e-2;
  c.schedule.warmup_num_steps = 3;
  c.schedule.warmup_type = WarmupType::linear;
  c.loss_scaler.initial_scale_power = 8;
  c.loss_scaler.hysteresis = 1;
  c.seed = 7;
  if (run.tweak) run.tweak(c);
  return c;
}

// Row i of step k's global batch: inputs uniform in [-1, 1), targets a smooth function of them.
inline void mlp_batch(int step, int rows, int in, int out, std::vector<float>& x, std::vector<float>& t) {
  std::mt19937 gen(1000 + step);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  x.resize(static_cast<size_t>(rows) * in);
  t.resize(static_cast<size_t>(rows) * out);
  for (auto& v : x) v = u(gen);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < out; ++j) t[i * out + j] = std::sin(x[i * in + j % in] + 0.5f * x[i * in + (j + 1) % in]);
  }
}

// With `groups`, the engine is built on a process grid's groups and `comm` is their dp group.
inline RankResult train_mlp(Communicator& comm, const MlpRun& run, const ProcessGrid::Groups* groups = nullptr) {
  auto device = make_device("cpu", {.memory_budget = run.memory_budget});
  const int dp = comm.size(), r = comm.rank();
  const int mb = run.global_batch / (dp * run.gas);
  const int in = run.widths.front(), out = run.widths.back();
  RankResult result;
  {
    Engine engine = groups != nullptr ? Engine(*device, *groups, mlp_config(run)) : Engine(*device, comm, mlp_config(run));
    std::optional<StaleParams> stale;
    if (run.stale_params) stale.emplace(engine);
    Mlp mlp(stale ? static_cast<BlockHost&>(*stale) : engine, {run.widths});
    engine.finalize();
    int start = 0;
    if (!run.resume.empty()) {
      ckpt::load(engine, run.resume);
      start = static_cast<int>(engine.steps_run());
    }
    if (run.inspect) run.inspect(engine, start);
    // Every step keeps its own batch and losses: without a host sync per step the stream may
    // still read them when the host prepares the next.
    std::vector<std::vector<float>> xs(run.steps), ts(run.steps), losses(run.steps, std::vector<float>(run.gas));
    for (int k = start; k < run.steps; ++k) {
      auto& x = xs[k];
      auto& t = ts[k];
      mlp_batch(k, run.global_batch, in, out, x, t);
      if (k == run.poison_step && r == run.poison_rank)
        t[static_cast<size_t>(r * run.gas) * mb * out] = std::numeric_limits<float>::infinity();
      if (stale) stale->next_step(run.stale_params(k, result.steps));
      const uint64_t before = engine.comm_stats().total_bytes();
      for (int m = 0; m < run.gas; ++m) {
        const size_t row = static_cast<size_t>(r * run.gas + (run.repeat_first_micro ? 0 : m)) * mb;
        mlp.forward_backward(x.data() + row * in, t.data() + row * out, mb, &losses[k][m], m);
        const auto s = engine.step();
        if (s.boundary) result.steps.push_back(s);
      }
      if (run.synchronize_steps) engine.compute_stream().synchronize();
      result.comm_bytes_per_step = engine.comm_stats().total_bytes() - before;
      if (k + 1 == run.save_after) ckpt::save(engine, {.dir = run.checkpoint_dir});
      if (run.inspect) run.inspect(engine, k + 1);
    }
    engine.compute_stream().synchronize();
    losses.erase(losses.begin(), losses.begin() + start);
    for (const auto& step : losses) {
      double sum = 0;
      for (float l : step) sum += l;
      result.losses.push_back(sum / run.gas);
    }
    const auto stats = device->memory().stats();
    result.peak = stats.peak;
    result.planned = engine.plan().bytes[static_cast<size_t>(Tier::device)];
    result.final_loss_scale = engine.loss_scale();
    for (size_t t = 0; t < kTierCount; ++t) result.tier_bytes[t] = tier_total(engine.plan().bytes, static_cast<Tier>(t));
    result.swap_io = engine.swap_io();
    result.device_buckets = engine.plan().device_buckets;
    result.reduce_buckets = static_cast<int>(engine.plan().reduce_buckets.size());
    for (size_t b = 0; b < engine.plan().blocks.size(); ++b) {
      auto w = engine.master_values(static_cast<int>(b));
      w.resize(engine.plan().blocks[b].numel);  // padding differs with the world size
      result.weights.push_back(std::move(w));
    }
  }
  return result;
}

// Every rank's master weights and moments once a run has done `steps` steps, block by block
// (master, moment0, moment1 of block 0, then block 1...), for tests that compare whole states.
struct FinalState {
  std::mutex mutex;
  std::map<int, std::vector<std::vector<float>>> by_rank;

  std::function<void(Engine&, int)> keep_after(int steps) {
    return [this, steps](Engine& engine, int done) {
      if (done != steps) return;
      std::vector<std::vector<float>> arrays;
      for (int b = 0; b < static_cast<int>(engine.plan().blocks.size()); ++b) {
        for (StateKind kind : {StateKind::master, StateKind::moment0, StateKind::moment1}) {
          std::vector<float> values(engine.plan().range(kind, b).numel());
          engine.read_owned(kind, b, values);
          arrays.push_back(std::move(values));
        }
      }
      std::lock_guard lock(mutex);
      by_rank[engine.plan().rank] = std::move(arrays);
    };
  }
};

// Every rank of a local (threads) group of `dp` trains the MLP; their results in rank order.
inline std::vector<RankResult> run_ranks(int dp, const MlpRun& run) {
  std::vector<RankResult> results(dp);
  run_local_ranks(dp, [&](Communicator& comm) { results[comm.rank()] = train_mlp(comm, run); });
  return results;
}

}  // namespace zeroth::testing
