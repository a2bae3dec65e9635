// The engine's front: registration, planning and the budget check, the block-use calls handed to
// the executor, and the step's policy (overflow, loss scale, clipping, learning rate).
#include "engine/engine.h"

#include <cstddef>     // std::byte
#include <filesystem>  // std::filesystem::create_directories
#include <map>         // std::map

#include <chrono>  // std::chrono::steady_clock

#include <nlohmann/json.hpp>  // nlohmann::json
#include <cmath>              // std::sqrt, std::isfinite

#include "core/error.h"                  // ZEROTH_THROW
#include "core/log.h"                    // ZLOG_INFO
#include "engine/plan/estimate.h"        // estimate, check_fits
#include "offload/swap_file.h"           // offload::free_bytes
#include "engine/executor/executor.h"    // Executor
#include "engine/executor/param_init.h"  // init_values

namespace zeroth {

Engine::Engine(Device& device, Communicator& dp, EngineConfig config)
    : device_(device), comm_(dp), config_(std::move(config)), tiers_(device, config_.host_memory), scaler_(config_.loss_scaler) {
  config_.validate();
  if (config_.compute_dtype != DType::f16) scaler_ = LossScaler(LossScalerConfig{.loss_scale = 1.0});
}

Engine::Engine(Device& device, const ProcessGrid::Groups& groups, EngineConfig config)
    : Engine(device, *groups.dp, std::move(config)) {}

Engine::~Engine() = default;

int Engine::add_block(BlockSpec spec) {
  if (exec_) ZEROTH_THROW(InvalidArgument, "add_block({}) after finalize(): register every block first", spec.name);
  specs_.push_back(std::move(spec));
  return static_cast<int>(specs_.size()) - 1;
}

void Engine::set_schedule(BlockSchedule schedule) {
  if (exec_) ZEROTH_THROW(InvalidArgument, "set_schedule after finalize()");
  schedules_ = {std::move(schedule)};
}

void Engine::set_chunk_schedules(std::vector<BlockSchedule> chunks) {
  if (exec_) ZEROTH_THROW(InvalidArgument, "set_chunk_schedules after finalize()");
  if (chunks.empty()) ZEROTH_THROW(InvalidArgument, "set_chunk_schedules with no chunk");
  schedules_ = std::move(chunks);
}

void Engine::set_pass_order(std::vector<PassRef> passes) {
  if (exec_) ZEROTH_THROW(InvalidArgument, "set_pass_order after finalize()");
  passes_ = std::move(passes);
}

void Engine::set_pipeline(Communicator& stages, int tied_block) {
  if (exec_) ZEROTH_THROW(InvalidArgument, "set_pipeline after finalize()");
  // A tied embedding has a copy on the first and the last stage (an untied model names none).
  const bool end = stages.rank() == 0 || stages.rank() == stages.size() - 1;
  if (stages.size() > 1 && !end && tied_block >= 0) {
    ZEROTH_THROW(InvalidArgument, "set_pipeline: stage {} of {} names a tied block; only the first and the last stage hold one",
                 stages.rank(), stages.size());
  }
  stage_comm_ = stages.split(0, stages.rank());
  tie_comm_ = stages.split(stages.size() > 1 && end && tied_block >= 0 ? 0 : -1, stages.rank());
  tied_block_ = stages.size() > 1 ? tied_block : -1;
}

void Engine::set_tensor_parallel(Communicator& tensor) {
  if (exec_) ZEROTH_THROW(InvalidArgument, "set_tensor_parallel after finalize()");
  tensor_comm_ = tensor.split(0, tensor.rank());
  tensor_reduce_comm_ = tensor.split(0, tensor.rank());
}

int Engine::chunk_micro_batches_in_flight(int chunk) const {
  if (!exec_) ZEROTH_THROW(InvalidArgument, "chunk_micro_batches_in_flight() before finalize()");
  return plan_.chunk_in_flight.at(chunk);
}

int Engine::micro_batches_in_flight() const {
  if (!exec_) ZEROTH_THROW(InvalidArgument, "micro_batches_in_flight() before finalize()");
  return plan_.max_in_flight;
}

void Engine::finalize(const ModelFootprint& model) {
  if (exec_) ZEROTH_THROW(InvalidArgument, "finalize() called twice");
  finalize(make_plan(specs_, schedules_.empty() ? std::vector{default_schedule(specs_.size())} : schedules_, config_, comm_.size(),
                     comm_.rank(), passes_),
           model);
}

void Engine::finalize(Plan plan, const ModelFootprint& model, bool initialize_values) {
  if (exec_) ZEROTH_THROW(InvalidArgument, "finalize() called twice");
  // A plan from elsewhere must be the one this engine would make.
  bool same = plan.blocks.size() == specs_.size() && plan.dp == comm_.size() && plan.rank == comm_.rank() &&
              plan.stage == config_.zero.stage && plan.compute_dtype == config_.compute_dtype &&
              plan.comm_dtype == config_.communication_dtype && plan.micro_batches == config_.gradient_accumulation_steps &&
              (passes_.empty() || plan.passes == passes_);
  for (size_t b = 0; same && b < specs_.size(); ++b) {
    size_t numel = 0;
    for (const auto& p : specs_[b].params) numel += p.numel();
    same = plan.blocks[b].name == specs_[b].name && plan.blocks[b].numel >= numel &&
           plan.blocks[b].param_offsets.size() == specs_[b].params.size();
  }
  if (!same) {
    ZEROTH_THROW(InvalidArgument,
                 "finalize(plan): the plan (stage {}, {} blocks, rank {} of {}) was not made for this engine's blocks, config and "
                 "group (stage {}, {} blocks, rank {} of {})",
                 plan.stage, plan.blocks.size(), plan.rank, plan.dp, config_.zero.stage, specs_.size(), comm_.rank(), comm_.size());
  }
  plan_ = std::move(plan);
  plan_.stages = pipeline_stages();
  if (plan_.tp != tensor_ranks() || plan_.tp_rank != tensor_rank()) {
    ZEROTH_THROW(InvalidArgument,
                 "finalize: the blocks' parameters are split for tensor-parallel rank {} of {}, but this engine's tensor-parallel "
                 "group makes it rank {} of {} (set_tensor_parallel)",
                 plan_.tp_rank, plan_.tp, tensor_rank(), tensor_ranks());
  }
  if (tied_block_ >= 0 && plan_.tied_block < 0) tie_block(plan_, tied_block_, stage_comm_->rank() == 0);
  if (plan_.tied_block != tied_block_) {
    ZEROTH_THROW(InvalidArgument, "finalize(plan): the plan ties block {} but the pipeline's tied block here is {}", plan_.tied_block,
                 tied_block_);
  }
  const MemoryNeed need = estimate(plan_, model);
  for (Tier tier : {Tier::device, Tier::host}) {
    const auto stats = tiers_.stats(tier);
    check_fits(need, plan_, tier, tiers_.budget(tier), stats.total_in_use,
               tier == Tier::device ? config_.device_budget_name : config_.host_budget_name);
  }
  // Each swap folder must hold its files (a folder shared by parameters and optimizer state
  // holds both).
  std::map<std::string, size_t> disk;
  for (const auto& b : plan_.buffers) {
    if (b.tier == Tier::nvme) disk[swap_folder(config_.zero, b)] += b.bytes();
  }
  for (const auto& [path, bytes] : disk) {
    std::error_code made;  // a missing folder is made, as DeepSpeed does
    std::filesystem::create_directories(path, made);
    if (made) {
      ZEROTH_THROW(IoError,
                   "the swap folder \"{}\" (zero_optimization.offload_optimizer/offload_param.nvme_path) cannot be created: {}; "
                   "name a writable folder on the drive",
                   path, made.message());
    }
    if (const uint64_t free = offload::free_bytes(path); bytes > free) {
      ZEROTH_THROW(OutOfMemory,
                   "the swap files of rank {} need {} in {} ({}) but it has {} free; nothing was written. Free space there, point "
                   "offload_optimizer/offload_param.nvme_path at a larger drive, or use more data-parallel ranks",
                   plan_.rank, format_bytes(bytes), path, need.describe(Tier::nvme), format_bytes(free));
    }
  }
  if (const auto& o = config_.zero.offload_optimizer;
      plan_.rank == 0 && o.enabled() && o.ratio < 1 && plan_.device_buckets == 0 && !plan_.reduce_buckets.empty()) {
    ZLOG_WARN("zero_optimization.offload_optimizer.ratio = {:g} keeps nothing on the device: the first reduce bucket ({} elements per "
              "rank) is more than {:g} of the shard ({}); lower zero_optimization.reduce_bucket_size to split finer",
              o.ratio, plan_.reduce_buckets.front().shard_numel, 1 - o.ratio, plan_.shard_numel);
  }
  if (plan_.rank == 0) {
    ZLOG_INFO("{}", plan_.table());
    plan_.write_json_if_requested();
  }
  exec_ = std::make_unique<Executor>(device_, tiers_, comm_, plan_, specs_, config_,
                                     GroupLinks{stage_comm_.get(), tie_comm_.get(), tensor_comm_.get(), tensor_reduce_comm_.get()});
  exec_->set_speculation([this]() -> std::optional<UpdateArgs> {
    if (!speculate_) return std::nullopt;
    return update_args(1.0 / (scaler_.scale() * plan_.dp));
  });
  values_initialized_ = initialize_values;
  initialize(initialize_values);
}

void Engine::reinitialize() {
  between_cycles("reinitialize", -1);
  initialize(values_initialized_);
  applied_ = cycles_ = 0;
  scaler_ = LossScaler(config_.loss_scaler);
  speculate_ = true;
  // Values finalize() left for the caller to set are zeros again (the allocations' first contents).
  for (size_t b = 0; !values_initialized_ && b < specs_.size(); ++b)
    exec_->write_block(static_cast<int>(b), [](size_t lo, size_t hi, float* out) { std::fill(out, out + (hi - lo), 0.0f); });
  // start() leaves swap files alone (they start as zeroed extents): the moments there are written
  // as zeros again.
  std::vector<std::byte> zeros;
  for (size_t b = 0; b < plan_.blocks.size(); ++b) {
    for (StateKind kind : {StateKind::moment0, StateKind::moment1}) {
      const OwnedRange* r = plan_.find(kind, static_cast<int>(b));
      if (r == nullptr || plan_.buffers[r->buffer].tier != Tier::nvme) continue;
      zeros.assign(r->numel() * dtype_size(plan_.buffers[r->buffer].dtype), std::byte{0});
      exec_->write_owned(*r, zeros.data());
    }
  }
  exec_->release_scratch();
}

void Engine::initialize(bool values) {
  for (size_t b = 0; values && b < specs_.size(); ++b) write_initial_values(static_cast<int>(b));
  exec_->release_scratch();
  exec_->start();
  pristine_ = true;
}

void Engine::initialize_block(int block) {
  pristine_ = false;
  between_cycles("initialize_block", block);
  write_initial_values(block);
}

void Engine::write_initial_values(int b) {
  {
    const auto& blk = plan_.blocks[b];
    const auto& spec = specs_[b];
    exec_->write_block(b, [&](size_t lo, size_t hi, float* out) {
      for (size_t i = 0; i < spec.params.size(); ++i) {
        const size_t p0 = blk.param_offsets[i], p1 = p0 + spec.params[i].numel();
        const size_t a = std::max(p0, lo), e = std::min(p1, hi);
        if (a >= e) continue;
        // A tensor-parallel slice takes the unsplit tensor's values at its elements.
        const std::string name = spec.name + "." + spec.params[i].name;
        spec.params[i].tp.for_each_run(a - p0, e - p0, [&](size_t full, size_t count, size_t local) {
          init_values(spec.params[i].init, config_.seed, name, full, count, out + (p0 + local - lo));
        });
      }
    });
  }
}

CommStats Engine::comm_stats() const { return exec_ ? exec_->comm_stats() : CommStats{}; }

SwapIo Engine::swap_io() const { return exec_ ? exec_->swap_io() : SwapIo{}; }
uint64_t Engine::swap_disk_bytes() const { return exec_ ? exec_->swap_disk_bytes() : 0; }

Executor& Engine::running(const char* what, int block) const {
  if (!exec_) ZEROTH_THROW(InvalidArgument, "{}({}) before finalize()", what, block);
  return *exec_;
}

const BlockViews& Engine::begin_forward(int block, int micro) {
  return running("begin_forward", block).begin(block, micro, Pass::forward, "begin_forward");
}

void Engine::end_forward(int block, int micro) { running("end_forward", block).end(block, micro, Pass::forward, "end_forward"); }

const BlockViews& Engine::begin_backward(int block, int micro) {
  auto& exec = running("begin_backward", block);
  if (exec.evaluating()) ZEROTH_THROW(InvalidArgument, "begin_backward({}) during evaluation", block);
  return exec.begin(block, micro, Pass::backward, "begin_backward");
}

void Engine::end_backward(int block, int micro) { running("end_backward", block).end(block, micro, Pass::backward, "end_backward"); }

void Engine::begin_evaluation() {
  auto& exec = running("begin_evaluation", -1);
  if (exec.evaluating() || !exec.at_cycle_start()) {
    ZEROTH_THROW(InvalidArgument, "begin_evaluation() inside a cycle ({} block uses done); evaluate between steps", exec.uses_done());
  }
  exec.begin_evaluation();
}

void Engine::end_evaluation() {
  auto& exec = running("end_evaluation", -1);
  if (!exec.evaluating()) ZEROTH_THROW(InvalidArgument, "end_evaluation() without begin_evaluation()");
  exec.end_evaluation();
}

double Engine::loss_gradient_scale() const { return scaler_.scale() / static_cast<double>(config_.gradient_accumulation_steps); }

StepResult Engine::step() {
  auto& exec = running("step", -1);
  if (exec.evaluating()) ZEROTH_THROW(InvalidArgument, "step() during evaluation; call end_evaluation() first");
  if (!exec.after_backward_pass()) {
    ZEROTH_THROW(
        InvalidArgument,
        "step() after {} block uses of the cycle, not at the end of a backward pass; run the micro-batch's forward and backward first",
        exec.uses_done());
  }
  StepResult result;
  result.step = applied_;
  result.loss_scale = scaler_.scale();
  if (!exec.cycle_complete()) return result;
  result.boundary = true;
  ++cycles_;
  pristine_ = false;

  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  if (config_.time_breakdown) exec.wait_for_reductions();
  const auto t1 = Clock::now();
  // Every return below goes through here once the step's work is enqueued.
  auto timed = [&](StepResult r) {
    if (!config_.time_breakdown) return r;
    compute_stream().synchronize();
    exec.drain_swaps();
    r.reduce_wait_seconds = std::chrono::duration<double>(t1 - t0).count();
    r.update_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
    const SwapIo io = exec.swap_io();
    r.swap_read_bytes = io.read_bytes - swap_io_.read_bytes;
    r.swap_write_bytes = io.write_bytes - swap_io_.write_bytes;
    r.swap_busy_seconds = io.busy_seconds - swap_io_.busy_seconds;
    r.update_swap_read_bytes = io.optimizer_read_bytes - swap_io_.optimizer_read_bytes;
    r.update_swap_write_bytes = io.optimizer_write_bytes - swap_io_.optimizer_write_bytes;
    swap_io_ = io;
    return r;
  };
  // A delayed update runs under the next step once the warm-up's updates are applied.
  const bool delay = plan_.delayed_update && applied_ >= static_cast<int64_t>(config_.zero.offload_optimizer.delayed_update_warmup);
  const double sumsq = exec.grad_norm();
  // The micro-batches' gradients were scaled by loss_gradient_scale(), so their sum is the
  // accumulated mean times the loss scale; the ranks' sum is dp times the average.
  const double inv = 1.0 / (scaler_.scale() * plan_.dp);
  const bool overflow = !std::isfinite(sumsq);
  result.grad_norm = std::sqrt(sumsq) * inv;
  if (config_.compute_dtype == DType::f16) scaler_.update(overflow);
  result.loss_scale = scaler_.scale();
  if (overflow) {
    result.skipped = true;
    if (config_.compute_dtype != DType::f16) ZLOG_WARN("step {}: the gradients hold Inf or NaN; the step is skipped", cycles_);
    result.speculation = exec.finish_step(std::nullopt, delay);
    speculate_ = false;
    return timed(result);
  }
  double clip = 1.0;
  // DeepSpeed's unscale_and_clip_grads: clip when (norm + 1e-6) / max_norm exceeds 1.
  if (config_.gradient_clipping > 0 && result.grad_norm + 1e-6 > config_.gradient_clipping) {
    clip = config_.gradient_clipping / (result.grad_norm + 1e-6);
  }
  const UpdateArgs args = update_args(inv * clip);
  result.lr = args.lr;
  result.speculation = exec.finish_step(args, delay);
  result.update_delayed = delay;
  speculate_ = clip == 1.0;
  applied_ = args.step;
  result.step = args.step;
  return timed(result);
}

UpdateArgs Engine::update_args(double grad_scale) const {
  UpdateArgs args;
  args.step = applied_ + 1;
  const ScheduledValues scheduled = config_.schedule.at_step(args.step);
  args.lr = scheduled.lr;
  args.grad_scale = static_cast<float>(grad_scale);
  if (scheduled.sets_betas) args.betas = {scheduled.beta1, scheduled.beta2};
  return args;
}

std::vector<float> Engine::master_values(int block) {
  std::vector<float> out;
  master_values(block, out);
  return out;
}

void Engine::master_values(int block, std::vector<float>& out) {
  ZEROTH_CHECK(exec_ && block >= 0 && static_cast<size_t>(block) < plan_.blocks.size(), "master_values({})", block);
  exec_->settle();
  exec_->master_values(block, out);
}

void Engine::set_master_values(int block, std::span<const float> values) {
  pristine_ = false;
  ZEROTH_CHECK(exec_ && block >= 0 && static_cast<size_t>(block) < plan_.blocks.size(), "set_master_values({})", block);
  if (!exec_->at_cycle_start() || exec_->evaluating())
    ZEROTH_THROW(InvalidArgument, "set_master_values({}) in the middle of a cycle", specs_[block].name);
  const auto& blk = plan_.blocks[block];
  const auto& spec = specs_[block];
  size_t unpadded = 0;
  for (const auto& p : spec.params) unpadded += p.numel();
  if (values.size() != unpadded && values.size() != blk.padded) {
    ZEROTH_THROW(InvalidArgument, "set_master_values({}): {} values, but the block has {} parameters ({} padded)", spec.name,
                 values.size(), unpadded, blk.padded);
  }
  const bool padded = values.size() == blk.padded;
  set_block_values(block, [&](size_t lo, size_t hi, float* out) {
    size_t src = 0;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const size_t p0 = blk.param_offsets[i], n = spec.params[i].numel();
      if (padded) src = p0;
      const size_t a = std::max(p0, lo), e = std::min(p0 + n, hi);
      if (a < e) std::copy(values.begin() + (src + a - p0), values.begin() + (src + e - p0), out + (a - lo));
      src += n;
    }
  });
}

Executor& Engine::between_cycles(const char* what, int block) const {
  auto& exec = running(what, block);
  ZEROTH_CHECK(block >= -1 && block < static_cast<int>(specs_.size()), "{}({}): the engine has {} blocks", what, block, specs_.size());
  if (!exec.at_cycle_start() || exec.evaluating()) {
    ZEROTH_THROW(InvalidArgument, "{}({}) in the middle of a cycle ({} block uses done); call it between steps", what,
                 block >= 0 ? specs_.at(block).name : std::string("-"), exec.uses_done());
  }
  exec.settle();
  return exec;
}

namespace {

void check_f32_kind(StateKind kind, const char* what) {
  if (kind != StateKind::master && kind != StateKind::moment0 && kind != StateKind::moment1)
    ZEROTH_THROW(InvalidArgument, "{}({}): only master and moment state is f32 and owned for checkpoints", what,
                 state_kind_name(kind));
}

}  // namespace

void Engine::read_owned(StateKind kind, int block, std::span<float> out) {
  auto& exec = between_cycles("read_owned", block);
  check_f32_kind(kind, "read_owned");
  // A frozen block's master is its parameter shard, which a checkpoint saves widened.
  const OwnedRange& r = plan_.f32_range(kind, block);
  ZEROTH_CHECK(out.size() == r.numel(), "read_owned({}, {}): {} values for a range of {}", state_kind_name(kind), block, out.size(),
               r.numel());
  if (kind == StateKind::master) {
    exec.read_values(block, out.data());
  } else {
    exec.read_owned(r, out.data());
  }
}

void Engine::write_owned(StateKind kind, int block, std::span<const float> values) {
  pristine_ = false;
  auto& exec = between_cycles("write_owned", block);
  check_f32_kind(kind, "write_owned");
  if (kind == StateKind::master)
    ZEROTH_THROW(InvalidArgument, "write_owned(master): use set_block_values, which keeps the copies in step");
  const OwnedRange& r = plan_.range(kind, block);
  ZEROTH_CHECK(values.size() == r.numel(), "write_owned({}, {}): {} values for a range of {}", state_kind_name(kind), block,
               values.size(), r.numel());
  exec.write_owned(r, values.data());
}

float* Engine::values_in_place(int block) {
  pristine_ = false;
  return between_cycles("values_in_place", block).values_in_place(block);
}

float* Engine::owned_in_place(StateKind kind, int block) {
  pristine_ = false;
  auto& exec = between_cycles("owned_in_place", block);
  check_f32_kind(kind, "owned_in_place");
  if (kind == StateKind::master)
    ZEROTH_THROW(InvalidArgument, "owned_in_place(master): use values_in_place, which holds the master with every copy");
  return exec.owned_in_place(plan_.range(kind, block));
}

const float* Engine::owned_in_host(StateKind kind, int block) const {
  auto& exec = between_cycles("owned_in_host", block);
  check_f32_kind(kind, "owned_in_host");
  return exec.owned_in_place(plan_.f32_range(kind, block));
}

void Engine::set_block_values(int block, const std::function<void(size_t, size_t, float*)>& fill) {
  pristine_ = false;
  between_cycles("set_block_values", block).write_block(block, fill);
}

size_t Engine::transfer_buffer_bytes() const { return exec_ ? exec_->scratch_bytes() : 0; }

void Engine::release_transfer_buffers() {
  if (exec_) exec_->release_scratch();
}

nlohmann::json Engine::counters() const {
  const auto s = scaler_.state();
  return {{"steps_applied", applied_},
          {"steps_run", cycles_},
          {"loss_scaler",
           {{"scale", s.scale}, {"iteration", s.iteration}, {"last_overflow", s.last_overflow}, {"hysteresis", s.hysteresis}}}};
}

void Engine::restore_counters(const nlohmann::json& c) {
  pristine_ = false;
  between_cycles("restore_counters", -1);
  applied_ = c.at("steps_applied").get<int64_t>();
  cycles_ = c.at("steps_run").get<int64_t>();
  // A loss scale only means something to an f16 run; the other precisions keep theirs at 1.
  if (config_.compute_dtype == DType::f16) {
    const auto& s = c.at("loss_scaler");
    scaler_.restore({s.at("scale").get<double>(), s.at("iteration").get<int64_t>(), s.at("last_overflow").get<int64_t>(),
                     s.at("hysteresis").get<int>()});
  }
}

}  // namespace zeroth
