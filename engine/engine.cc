// The engine's executor: it walks the plan. Three streams: compute (the model's, the device's
// default), gather (parameter all-gathers) and reduce (gradient reductions); events order them.
#include "engine/engine.h"

#include <algorithm>  // std::min
#include <array>      // std::array
#include <cmath>      // std::sqrt, std::isfinite
#include <fstream>    // std::ofstream

#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/cpu/kernels.h"  // cpu::cast
#include "core/env.h"          // env::kPlanJson
#include "core/error.h"        // ZEROTH_THROW
#include "core/log.h"          // ZLOG_INFO
#include "engine/init.h"       // init_values
#include "optim/optimizer.h"   // cpu_optimizer_step

namespace zeroth {

Engine::Engine(Device& device, Communicator& dp, EngineConfig config)
    : device_(device), comm_(dp), config_(std::move(config)), scaler_(config_.loss_scaler) {
  config_.validate();
  if (config_.compute_dtype != DType::f16) scaler_ = LossScaler(LossScalerConfig{.loss_scale = 1.0});
}

Engine::~Engine() {
  // Streams may still run work that points into our buffers.
  try {
    if (gather_stream_) gather_stream_->synchronize();
    if (reduce_stream_) reduce_stream_->synchronize();
    compute_stream().synchronize();
  } catch (const std::exception& e) {
    ZLOG_WARN("engine shutting down after a failed step: {}", e.what());
  }
}

int Engine::add_block(BlockSpec spec) {
  if (finalized_) ZEROTH_THROW(InvalidArgument, "add_block({}) after finalize(): register every block first", spec.name);
  specs_.push_back(std::move(spec));
  return static_cast<int>(specs_.size()) - 1;
}

void Engine::set_schedule(BlockSchedule schedule) {
  if (finalized_) ZEROTH_THROW(InvalidArgument, "set_schedule after finalize()");
  schedule_ = std::move(schedule);
  schedule_set_ = true;
}

void Engine::check_budget() const {
  const auto stats = device_.memory().stats();
  const size_t need = plan_.total_bytes();
  if (stats.budget == 0 || stats.total_in_use + need <= stats.budget) return;
  std::string parts;
  for (size_t t = 0; t < kMemTagCount; ++t) {
    if (plan_.bytes[t] > 0) parts += fmt::format(" {} {},", mem_tag_name(static_cast<MemTag>(t)), format_bytes(plan_.bytes[t]));
  }
  std::string advice;
  if (plan_.stage < 3) advice += fmt::format(" raise zero_optimization.stage (now {}) to shard more state;", plan_.stage);
  if (plan_.reduce_staging + plan_.gather_staging > 0) advice += " lower reduce_bucket_size / allgather_bucket_size;";
  if (plan_.stage == 3) advice += " lower stage3_prefetch_bucket_size / stage3_max_live_parameters or stage3_param_persistence_threshold;";
  advice += " use more data-parallel ranks, or a larger device memory budget";
  ZEROTH_THROW(OutOfMemory,
               "the ZeRO stage {} plan needs {} per rank on {} ({}) but {} of the {} budget is free ({} in use); nothing was allocated. To fit:{}",
               plan_.stage, format_bytes(need), device_.name(), parts.substr(0, parts.size() - 1),
               format_bytes(stats.budget - std::min(stats.budget, stats.total_in_use)), format_bytes(stats.budget),
               format_bytes(stats.total_in_use), advice);
}

void Engine::finalize() {
  if (finalized_) ZEROTH_THROW(InvalidArgument, "finalize() called twice");
  if (!schedule_set_) schedule_ = default_schedule(specs_.size());
  plan_ = make_plan(specs_, schedule_, config_, comm_.size(), comm_.rank());
  check_budget();
  if (plan_.rank == 0) {
    ZLOG_INFO("{}", plan_.table());
    if (const auto path = env::get(env::kPlanJson)) {
      std::ofstream out(*path);
      out << plan_.to_json().dump(1) << "\n";
      if (!out) ZEROTH_THROW(IoError, "writing the plan to {} (ZEROTH_PLAN_JSON) failed", *path);
    }
  }

  const size_t c = dtype_size(plan_.compute_dtype);
  const size_t owned = plan_.stage == 0 ? plan_.total_padded : plan_.shard_numel;
  gather_stream_ = device_.create_stream();
  reduce_stream_ = device_.create_stream();
  // One communicator per stream: collectives of one communicator must run in the same order on
  // every rank, which two streams running concurrently would not guarantee.
  gather_comm_ = comm_.split(0, comm_.rank());
  reduce_comm_ = comm_.split(0, comm_.rank());
  step_comm_ = comm_.split(0, comm_.rank());
  if (plan_.stage <= 2) {
    params_full_ = device_.allocate(plan_.total_padded * c, MemTag::params);
  } else {
    param_shard_ = device_.allocate(plan_.shard_numel * c, MemTag::params);
    if (plan_.persistent_numel > 0) params_full_ = device_.allocate(plan_.persistent_numel * c, MemTag::params);
    if (plan_.param_arena > 0) param_arena_.buffer = device_.allocate(plan_.param_arena * c, MemTag::params);
  }
  if (!plan_.master_aliases_params) master_ = device_.allocate(owned * 4, MemTag::optimizer);
  for (int k = 0; k < plan_.state_arrays; ++k) state_[k] = device_.allocate(owned * 4, MemTag::optimizer);
  if (plan_.stage <= 1) grad_accum_ = device_.allocate(plan_.total_padded * 4, MemTag::grads);
  if (plan_.stage >= 1) grad_shard_ = device_.allocate(plan_.shard_numel * 4, MemTag::grads);
  if (plan_.grad_arena > 0) grad_arena_.buffer = device_.allocate(plan_.grad_arena * c, MemTag::grads);
  if (plan_.reduce_staging > 0) {
    reduce_staging_ = device_.allocate(plan_.reduce_staging * dtype_size(plan_.comm_dtype), MemTag::buffers);
  }
  if (plan_.gather_staging > 0) gather_staging_ = device_.allocate(plan_.gather_staging * c, MemTag::buffers);
  scalar_ = device_.allocate(sizeof(float), MemTag::buffers);

  const size_t n = plan_.blocks.size();
  gathered_.assign(n, nullptr);
  persistent_offset_.assign(n, 0);
  grad_offset_.assign(n, 0);
  grad_reduced_.assign(n, nullptr);
  views_.resize(n);
  size_t at = 0;
  for (int b : plan_.shard_order) {
    const auto& blk = plan_.blocks[b];
    if (plan_.stage <= 2) {
      gathered_[b] = static_cast<char*>(params_full_.data()) + blk.full_offset * c;
    } else if (blk.persistent) {
      persistent_offset_[b] = at;
      gathered_[b] = static_cast<char*>(params_full_.data()) + at * c;
      at += blk.padded;
    }
  }
  for (size_t b = 0; b < n; ++b) gathered_event_.push_back(device_.create_event());
  initialise();
  finalized_ = true;
}

CommStats Engine::comm_stats() const {
  CommStats total;
  for (const auto* c : {gather_comm_.get(), reduce_comm_.get(), step_comm_.get()}) {
    if (c == nullptr) continue;
    const auto s = c->stats();
    for (size_t op = 0; op < kCollectiveOpCount; ++op) {
      total.calls[op] += s.calls[op];
      total.bytes[op] += s.bytes[op];
      total.bus_bytes[op] += s.bus_bytes[op];
    }
  }
  return total;
}

// ---- the walk -------------------------------------------------------------------------------

std::shared_ptr<Event> Engine::record(Stream& stream) {
  std::shared_ptr<Event> e = device_.create_event();
  e->record(stream);
  return e;
}

void Engine::place(Arena& arena, size_t offset, size_t length, Stream& writer) {
  // The region's previous tenants must be done with it before the writer overwrites it.
  std::erase_if(arena.released, [&](const Released& r) {
    if (r.offset >= offset + length || offset >= r.offset + r.length) return false;
    writer.wait(*r.done);
    return r.offset >= offset && r.offset + r.length <= offset + length;
  });
}

void Engine::release(Arena& arena, size_t offset, size_t length, Stream& last_user) {
  arena.released.push_back({offset, length, record(last_user)});
}

TensorView Engine::full_params(int block) const {
  ZEROTH_CHECK(gathered_[block] != nullptr, "block {} is not gathered", plan_.blocks[block].name);
  return {gathered_[block], plan_.blocks[block].padded, plan_.compute_dtype};
}

TensorView Engine::grad_view(int block) const {
  const auto& blk = plan_.blocks[block];
  if (plan_.stage <= 1 && plan_.compute_dtype == DType::f32) return accumulated(block);
  return {static_cast<char*>(grad_arena_.buffer.data()) + grad_offset_[block] * dtype_size(plan_.compute_dtype),
          blk.padded, plan_.compute_dtype};
}

TensorView Engine::accumulated(int block) const {
  const auto& blk = plan_.blocks[block];
  return {grad_accum_.as<float>() + blk.full_offset, blk.padded, DType::f32};
}

float* Engine::master_shard(int block) const {
  const auto& blk = plan_.blocks[block];
  if (!plan_.master_aliases_params) {
    return master_.as<float>() + (plan_.stage == 0 ? blk.full_offset : blk.shard_offset);
  }
  if (plan_.stage == 0) return static_cast<float*>(gathered_[block]);
  if (plan_.stage <= 2) return static_cast<float*>(gathered_[block]) + plan_.rank * blk.shard;
  return param_shard_.as<float>() + blk.shard_offset;
}

void Engine::gather_block(int block, size_t arena_offset) {
  const auto& blk = plan_.blocks[block];
  const size_t c = dtype_size(plan_.compute_dtype);
  place(param_arena_, arena_offset, blk.padded, *gather_stream_);
  gathered_[block] = static_cast<char*>(param_arena_.buffer.data()) + arena_offset * c;
  const TensorView shard{static_cast<char*>(param_shard_.data()) + blk.shard_offset * c, blk.shard, plan_.compute_dtype};
  gather_comm_->all_gather(*gather_stream_, shard, full_params(block));
  gathered_event_[block]->record(*gather_stream_);
}

void Engine::release_gathered(int b) {
  const size_t offset = (static_cast<char*>(gathered_[b]) - static_cast<char*>(param_arena_.buffer.data())) /
                        dtype_size(plan_.compute_dtype);
  release(param_arena_, offset, plan_.blocks[b].padded, compute_stream());
  gathered_[b] = nullptr;
}

void Engine::release_params(const PlannedUse& use) {
  for (int b : use.releases) release_gathered(b);
}

const PlannedUse& Engine::enter(int block, bool backward, const char* what) {
  if (!finalized_) ZEROTH_THROW(InvalidArgument, "{}({}) before finalize()", what, block);
  if (pos_ >= plan_.uses.size()) {
    ZEROTH_THROW(InvalidArgument, "{}({}): the micro-step's schedule is complete; call step() first", what, block);
  }
  const auto& use = plan_.uses[pos_];
  if (use.block != block || use.backward != backward) {
    ZEROTH_THROW(InvalidArgument, "{}({}) out of schedule: use {} of the micro-step is {} of block {} ({}); the model must follow the schedule given to the engine",
                 what, block < 0 || static_cast<size_t>(block) >= specs_.size() ? std::to_string(block) : specs_[block].name,
                 pos_, use.backward ? "backward" : "forward", use.block, specs_[use.block].name);
  }
  return use;
}

const BlockViews& Engine::begin_forward(int block) {
  const auto& use = enter(block, false, "begin_forward");
  for (const auto& g : use.gathers) gather_block(g.block, g.arena_offset);
  if (plan_.stage == 3) compute_stream().wait(*gathered_event_[block]);
  auto& v = views_[block];
  v.params.clear();
  v.grads.clear();
  const auto full = full_params(block);
  const auto& spec = specs_[block];
  for (size_t i = 0; i < spec.params.size(); ++i) v.params.push_back(full.slice(plan_.blocks[block].param_offsets[i], spec.params[i].numel()));
  return v;
}

void Engine::end_forward(int block) {
  const auto& use = enter(block, false, "end_forward");
  release_params(use);
  ++pos_;
}

void Engine::begin_evaluation() {
  if (!finalized_) ZEROTH_THROW(InvalidArgument, "begin_evaluation() before finalize()");
  if (evaluating_ || pos_ != 0) {
    ZEROTH_THROW(InvalidArgument, "begin_evaluation() inside a micro-step (use {} of {}); evaluate between steps", pos_, plan_.uses.size());
  }
  evaluating_ = true;
}

void Engine::end_evaluation() {
  if (!evaluating_) ZEROTH_THROW(InvalidArgument, "end_evaluation() without begin_evaluation()");
  // Stage 3: the forward uses gathered (and prefetched for the backward that will not come)
  // blocks; they go back to the arena so the next micro-step starts from the planned state.
  for (size_t b = 0; b < plan_.blocks.size(); ++b) {
    if (plan_.stage != 3 || gathered_[b] == nullptr || plan_.blocks[b].persistent) continue;
    compute_stream().wait(*gathered_event_[b]);
    release_gathered(static_cast<int>(b));
  }
  pos_ = 0;
  evaluating_ = false;
}

const BlockViews& Engine::begin_backward(int block) {
  if (evaluating_) ZEROTH_THROW(InvalidArgument, "begin_backward({}) during evaluation", block);
  const auto& use = enter(block, true, "begin_backward");
  for (const auto& g : use.gathers) gather_block(g.block, g.arena_offset);
  if (plan_.stage == 3) compute_stream().wait(*gathered_event_[block]);
  if (use.grad_alloc) {
    grad_offset_[block] = use.grad_arena_offset;
    place(grad_arena_, use.grad_arena_offset, plan_.blocks[block].padded, compute_stream());
    device_.fill(compute_stream(), grad_view(block), 0.0f);
  }
  auto& v = views_[block];
  v.params.clear();
  v.grads.clear();
  const auto full = full_params(block);
  const auto grads = grad_view(block);
  const auto& spec = specs_[block];
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const size_t off = plan_.blocks[block].param_offsets[i], n = spec.params[i].numel();
    v.params.push_back(full.slice(off, n));
    v.grads.push_back(grads.slice(off, n));
  }
  return v;
}

void Engine::end_backward(int block) {
  const auto& use = enter(block, true, "end_backward");
  const bool boundary = micro_ + 1 == config_.gradient_accumulation_steps;
  const bool transient = plan_.stage >= 2 || plan_.compute_dtype != DType::f32;
  if (use.last_backward_use && plan_.stage <= 1 && transient) {
    // Narrow gradients join the f32 accumulator as soon as the block is done with them.
    device_.axpy(compute_stream(), accumulated(block), 1.0f, grad_view(block));
  }
  if (use.fire_bucket >= 0 && (plan_.stage >= 2 || boundary)) fire_bucket(use.fire_bucket);
  for (int b : use.grad_releases) {
    // Stages 0-1: free once the compute stream has added them up; 2-3: once their bucket's
    // reduction (maybe still running) is done.
    if (plan_.stage <= 1) {
      release(grad_arena_, grad_offset_[b], plan_.blocks[b].padded, compute_stream());
    } else {
      grad_arena_.released.push_back({grad_offset_[b], plan_.blocks[b].padded, grad_reduced_[b]});
    }
  }
  release_params(use);
  ++pos_;
}

void Engine::fire_bucket(int index) {
  const auto& bucket = plan_.reduce_buckets[index];
  const int dp = plan_.dp, r = plan_.rank;
  Stream& rs = *reduce_stream_;
  rs.wait(*record(compute_stream()));
  const DType cd = plan_.comm_dtype;
  if (plan_.stage == 0) {
    size_t full = 0;
    for (int b : bucket.blocks) full += plan_.blocks[b].padded;
    const TensorView grads{grad_accum_.as<float>() + bucket.full_offset, full, DType::f32};
    if (bucket.staged) {
      const TensorView staging{reduce_staging_.data(), full, cd};
      device_.cast(rs, staging, grads);
      reduce_comm_->all_reduce(rs, staging, ReduceOp::sum);
      device_.cast(rs, grads, staging);
    } else {
      reduce_comm_->all_reduce(rs, grads, ReduceOp::sum);
    }
    reduced_ = record(rs);
    return;
  }
  const size_t n = bucket.shard_numel;
  TensorView send;
  if (bucket.staged) {
    send = {reduce_staging_.data(), n * dp, cd};
    for (int b : bucket.blocks) {
      const auto& blk = plan_.blocks[b];
      const TensorView src = plan_.stage == 1 ? accumulated(b) : grad_view(b);
      for (int k = 0; k < dp; ++k) {
        device_.cast(rs, send.slice(k * n + (blk.shard_offset - bucket.shard_offset), blk.shard), src.slice(k * blk.shard, blk.shard));
      }
    }
  } else {
    send = plan_.stage == 1 ? accumulated(bucket.blocks.front()) : grad_view(bucket.blocks.front());
  }
  // Stage 1 reduces once per cycle, at the boundary; 2-3 reduce every micro-step and add up.
  const bool first = plan_.stage == 1 || micro_ == 0;
  const TensorView shard{grad_shard_.as<float>() + bucket.shard_offset, n, DType::f32};
  if (first && cd == DType::f32) {
    reduce_comm_->reduce_scatter(rs, send, shard, ReduceOp::sum);
  } else {
    const TensorView mine = send.slice(r * n, n);
    reduce_comm_->reduce_scatter(rs, send, mine, ReduceOp::sum);
    if (first) {
      device_.cast(rs, shard, mine);
    } else {
      device_.axpy(rs, shard, 1.0f, mine);
    }
  }
  reduced_ = record(rs);
  for (int b : bucket.blocks) grad_reduced_[b] = reduced_;
}

// ---- the step -------------------------------------------------------------------------------

StepResult Engine::step() {
  if (!finalized_) ZEROTH_THROW(InvalidArgument, "step() before finalize()");
  if (evaluating_) ZEROTH_THROW(InvalidArgument, "step() during evaluation; call end_evaluation() first");
  if (pos_ != plan_.uses.size()) {
    ZEROTH_THROW(InvalidArgument, "step() after {} of the micro-step's {} block uses; run the whole forward and backward first", pos_,
                 plan_.uses.size());
  }
  pos_ = 0;
  StepResult result;
  result.step = applied_;
  result.loss_scale = scaler_.scale();
  if (++micro_ < config_.gradient_accumulation_steps) return result;
  micro_ = 0;
  result.boundary = true;

  Stream& cs = compute_stream();
  if (reduced_) cs.wait(*reduced_);
  const TensorView grads = plan_.stage == 0 ? grad_accum_.view(DType::f32) : grad_shard_.view(DType::f32);
  device_.sum_squares(cs, grads, scalar_.as<float>(), false);
  if (plan_.stage >= 1) step_comm_->all_reduce(cs, scalar_.view(DType::f32), ReduceOp::sum);
  float sumsq = 0;
  device_.copy(cs, &sumsq, scalar_.data(), sizeof(float));
  cs.synchronize();

  const double inv = 1.0 / (scaler_.scale() * plan_.dp * static_cast<double>(config_.gradient_accumulation_steps));
  const bool overflow = !std::isfinite(sumsq);
  result.grad_norm = std::sqrt(static_cast<double>(sumsq)) * inv;
  if (config_.compute_dtype == DType::f16) scaler_.update(overflow);
  result.loss_scale = scaler_.scale();
  if (overflow) {
    result.skipped = true;
    if (config_.compute_dtype != DType::f16) ZLOG_WARN("step {}: the gradients hold Inf or NaN; the step is skipped", applied_ + 1);
    if (plan_.stage <= 1) device_.fill(cs, grad_accum_.view(DType::f32), 0.0f);
    return result;
  }
  double clip = 1.0;
  if (config_.gradient_clipping > 0 && result.grad_norm > config_.gradient_clipping) {
    clip = config_.gradient_clipping / (result.grad_norm + 1e-6);
  }
  const int64_t t = applied_ + 1;
  result.lr = config_.schedule.lr(t - 1);
  apply_optimizer(t, result.lr, static_cast<float>(inv * clip));
  if (plan_.stage <= 1) device_.fill(cs, grad_accum_.view(DType::f32), 0.0f);
  applied_ = t;
  result.step = t;
  gather_after_step();
  return result;
}

void Engine::apply_optimizer(int64_t t, double lr, float grad_scale) {
  const size_t c = dtype_size(plan_.compute_dtype);
  OptimizerParams decay = config_.optimizer, no_decay = config_.optimizer;
  no_decay.weight_decay = 0;
  std::array<std::vector<OptimizerStep>, 2> steps;  // [0]: no decay, [1]: decay
  for (int b : plan_.shard_order) {
    const auto& blk = plan_.blocks[b];
    const auto& spec = specs_[b];
    // The owned range of the block's flat buffer, split where weight decay changes.
    const size_t lo = plan_.stage == 0 ? 0 : plan_.rank * blk.shard, hi = lo + (plan_.stage == 0 ? blk.padded : blk.shard);
    const size_t owned_base = plan_.stage == 0 ? blk.full_offset : blk.shard_offset;
    size_t at = lo;
    while (at < hi) {
      // Padding after a parameter goes with it; it stays zero under every update.
      size_t p = 0;
      while (p + 1 < spec.params.size() && blk.param_offsets[p + 1] <= at) ++p;
      size_t end = hi;
      const bool wd = spec.params.empty() || spec.params[p].weight_decay;
      for (size_t q = p + 1; q < spec.params.size(); ++q) {
        if (spec.params[q].weight_decay != wd) {
          end = std::min(hi, blk.param_offsets[q]);
          break;
        }
      }
      const size_t local = at - lo, count = end - at;
      OptimizerStep s;
      s.params = master_shard(b) + local;
      s.grad_type = DType::f32;
      s.grads = (plan_.stage == 0 ? grad_accum_.as<float>() + blk.full_offset : grad_shard_.as<float>() + blk.shard_offset) + local;
      for (int k = 0; k < plan_.state_arrays; ++k) s.state[k] = state_[k].as<float>() + owned_base + local;
      if (!plan_.master_aliases_params) {
        s.copy_out = plan_.stage <= 2 ? static_cast<char*>(gathered_[b]) + at * c
                                      : static_cast<char*>(param_shard_.data()) + (blk.shard_offset + local) * c;
        s.copy_out_type = plan_.compute_dtype;
      }
      s.count = count;
      s.step = t;
      s.lr = lr;
      s.grad_scale = grad_scale;
      s.check_finite = false;
      steps[wd ? 1 : 0].push_back(s);
      at = end;
    }
  }
  Stream& cs = compute_stream();
  if (device_.kind() == DeviceKind::cuda) {
    if (!steps[0].empty()) cuda_optimizer_step(no_decay, steps[0], cs);
    if (!steps[1].empty()) cuda_optimizer_step(decay, steps[1], cs);
    return;
  }
  cs.enqueue_host([decay, no_decay, steps = std::move(steps)] {
    for (const auto& s : steps[0]) cpu_optimizer_step(no_decay, s);
    for (const auto& s : steps[1]) cpu_optimizer_step(decay, s);
  });
}

void Engine::gather_after_step() {
  if (plan_.stage == 0) return;
  Stream& gs = *gather_stream_;
  gs.wait(*record(compute_stream()));
  if (plan_.stage == 3) {
    for (size_t b = 0; b < plan_.blocks.size(); ++b) {
      if (!plan_.blocks[b].persistent) continue;
      const auto& blk = plan_.blocks[b];
      const size_t c = dtype_size(plan_.compute_dtype);
      gather_comm_->all_gather(gs, {static_cast<char*>(param_shard_.data()) + blk.shard_offset * c, blk.shard, plan_.compute_dtype},
                       full_params(static_cast<int>(b)));
    }
  } else {
    const int dp = plan_.dp, r = plan_.rank;
    for (const auto& bucket : plan_.gather_buckets) {
      const size_t n = bucket.shard_numel;
      if (!bucket.staged) {
        const int b = bucket.blocks.front();
        const auto full = full_params(b);
        gather_comm_->all_gather(gs, full.slice(r * plan_.blocks[b].shard, plan_.blocks[b].shard), full);
        continue;
      }
      const TensorView staging{gather_staging_.data(), n * dp, plan_.compute_dtype};
      for (int b : bucket.blocks) {
        const auto& blk = plan_.blocks[b];
        device_.copy(gs, staging.slice(r * n + blk.shard_offset - bucket.shard_offset, blk.shard).data,
                     full_params(b).slice(r * blk.shard, blk.shard).data, blk.shard * dtype_size(plan_.compute_dtype));
      }
      gather_comm_->all_gather(gs, staging.slice(r * n, n), staging);
      for (int b : bucket.blocks) {
        const auto& blk = plan_.blocks[b];
        for (int k = 0; k < dp; ++k) {
          if (k == r) continue;
          device_.copy(gs, full_params(b).slice(k * blk.shard, blk.shard).data,
                       staging.slice(k * n + blk.shard_offset - bucket.shard_offset, blk.shard).data,
                       blk.shard * dtype_size(plan_.compute_dtype));
        }
      }
    }
  }
  compute_stream().wait(*record(gs));
}

// ---- initial values and inspection ----------------------------------------------------------

void Engine::write_block(int b, const std::function<void(size_t, size_t, float*)>& fill) {
  Stream& cs = compute_stream();
  const size_t c = dtype_size(plan_.compute_dtype);
  const int r = plan_.rank;
  const auto& blk = plan_.blocks[b];
  // Stages 0-2 hold the whole block on every rank; stage 3 only this rank's shard.
  const size_t lo = plan_.stage == 3 ? r * blk.shard : 0, hi = plan_.stage == 3 ? lo + blk.shard : blk.padded;
  std::vector<float> values(hi - lo, 0.0f);
  fill(lo, hi, values.data());
  std::vector<char> narrow(values.size() * c);
  cpu::cast(values.data(), DType::f32, narrow.data(), plan_.compute_dtype, values.size());
  void* dst = plan_.stage <= 2 ? gathered_[b] : static_cast<char*>(param_shard_.data()) + blk.shard_offset * c;
  device_.copy(cs, dst, narrow.data(), narrow.size());
  if (!plan_.master_aliases_params) {
    const size_t off = plan_.stage == 0 ? 0 : r * blk.shard - lo;  // stages 1-2: the shard of the whole block
    const size_t count = plan_.stage == 0 ? blk.padded : blk.shard;
    device_.copy(cs, master_shard(b), values.data() + off, count * sizeof(float));
  }
  cs.synchronize();  // `values` and `narrow` go out of scope
}

void Engine::initialise() {
  Stream& cs = compute_stream();
  for (int b : plan_.shard_order) {
    const auto& blk = plan_.blocks[b];
    const auto& spec = specs_[b];
    write_block(b, [&](size_t lo, size_t hi, float* out) {
      for (size_t i = 0; i < spec.params.size(); ++i) {
        const size_t p0 = blk.param_offsets[i], p1 = p0 + spec.params[i].numel();
        const size_t a = std::max(p0, lo), e = std::min(p1, hi);
        if (a < e) init_values(spec.params[i].init, config_.seed, spec.name + "." + spec.params[i].name, a - p0, e - a, out + (a - lo));
      }
    });
  }
  for (int k = 0; k < plan_.state_arrays; ++k) device_.fill(cs, state_[k].view(DType::f32), 0.0f);
  if (grad_accum_) device_.fill(cs, grad_accum_.view(DType::f32), 0.0f);
  if (grad_shard_) device_.fill(cs, grad_shard_.view(DType::f32), 0.0f);
  if (plan_.stage == 3) gather_after_step();
  cs.synchronize();
}

void Engine::set_master_values(int block, std::span<const float> values) {
  ZEROTH_CHECK(finalized_ && block >= 0 && static_cast<size_t>(block) < plan_.blocks.size(), "set_master_values({})", block);
  if (pos_ != 0 || micro_ != 0) ZEROTH_THROW(InvalidArgument, "set_master_values({}) in the middle of a step", specs_[block].name);
  const auto& blk = plan_.blocks[block];
  const auto& spec = specs_[block];
  size_t unpadded = 0;
  for (const auto& p : spec.params) unpadded += p.numel();
  if (values.size() != unpadded && values.size() != blk.padded) {
    ZEROTH_THROW(InvalidArgument, "set_master_values({}): {} values, but the block has {} parameters ({} padded)", spec.name,
                 values.size(), unpadded, blk.padded);
  }
  const bool padded = values.size() == blk.padded;
  write_block(block, [&](size_t lo, size_t hi, float* out) {
    size_t src = 0;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const size_t p0 = blk.param_offsets[i], n = spec.params[i].numel();
      if (padded) src = p0;
      const size_t a = std::max(p0, lo), e = std::min(p0 + n, hi);
      if (a < e) std::copy(values.begin() + (src + a - p0), values.begin() + (src + e - p0), out + (a - lo));
      src += n;
    }
  });
  if (plan_.stage == 3) gather_after_step();
  compute_stream().synchronize();
}

std::vector<float> Engine::master_values(int block) {
  ZEROTH_CHECK(finalized_ && block >= 0 && static_cast<size_t>(block) < plan_.blocks.size(), "master_values({})", block);
  const auto& blk = plan_.blocks[block];
  Stream& cs = compute_stream();
  std::vector<float> out(blk.padded);
  if (plan_.stage == 0) {
    device_.copy(cs, out.data(), master_shard(block), blk.padded * sizeof(float));
  } else {
    Buffer full = device_.allocate(blk.padded * sizeof(float), MemTag::other);
    step_comm_->all_gather(cs, {master_shard(block), blk.shard, DType::f32}, full.view(DType::f32));
    device_.copy(cs, out.data(), full.data(), blk.padded * sizeof(float));
    cs.synchronize();
  }
  cs.synchronize();
  return out;
}

}  // namespace zeroth
