// A training run's steps but the loop's own (train/training_run.h): making the engine and the
// model, restoring, evaluating, saving, reporting a step.
#include "train/training_run.h"

#include "train/hf/export.h"  // save_gpt_weights

#include <algorithm>   // std::max
#include <chrono>      // std::chrono::steady_clock
#include <cmath>       // std::isfinite, std::lround
#include <cstring>     // std::memmove
#include <exception>   // std::exception_ptr
#include <filesystem>  // std::filesystem::is_directory
#include <functional>  // std::function
#include <optional>    // std::optional
#include <vector>      // std::vector

#include <fmt/format.h>  // fmt::format

#include "core/env.h"                      // env::kRestartCount
#include "core/error.h"                    // ZEROTH_THROW
#include "core/memory.h"                   // format_bytes
#include "core/log.h"                      // ZLOG_WARN
#include "core/stats.h"                    // median
#include "engine/checkpoint/checkpoint.h"  // ckpt::save, ckpt::load
#include "engine/engine.h"                 // Engine
#include "engine/plan/estimate.h"          // estimate
#include "engine/pipeline/runner.h"        // PipelineRunner
#include "comm/process_grid.h"             // ProcessGrid
#include "models/decoder/context_ring.h"   // gpt::ring_chunk
#include "models/decoder/gpt.h"            // Gpt
#include "train/data.h"                    // RunData, open_run_data

namespace zeroth {

TrainingRun::TrainingRun(const TrainConfig& config, Communicator& world, Device& device, TrainObserver* observer,
                         const std::atomic<bool>* stop)
    : config_(config),
      world_(world),
      device_(device),
      observer_(observer),
      stop_(stop),
      lead_(checked_rank(config, world) == 0),
      pp_(config.parallel.pipeline),
      tp_(config.parallel.tensor),
      groups_(pp_ > 1 || tp_ > 1 ? std::optional(ProcessGrid(config.data_parallel(), pp_, tp_).split(world)) : std::nullopt),
      dp_(groups_ ? *groups_->dp : world),
      experts_(config.parallel.expert > 1 ? dp_.split(dp_.rank() / config.parallel.expert, dp_.rank()) : nullptr),
      sequence_(config.sample_ranks() > 1 ? dp_.split(dp_.rank() / config.sample_ranks(), dp_.rank()) : nullptr),
      stage_(groups_ ? groups_->pp->rank() : 0),
      tp_rank_(groups_ ? groups_->tp->rank() : 0),
      part_(config.part(stage_, tp_rank_, dp_.rank())),
      runner_(pp_ > 1
                  ? std::make_unique<PipelineRunner>(device, *groups_->pp,
                                                     make_pipe_schedule(config.parallel.schedule, pp_,
                                                                        static_cast<int>(config.engine.gradient_accumulation_steps),
                                                                        config.parallel.virtual_stages))
                  : nullptr),
      heads_(part_.has_head(config.model)),
      mb_(static_cast<int>(config.micro_batch_size)),
      T_(config.model.seq_len),
      gas_(static_cast<int>(config.engine.gradient_accumulation_steps)),
      U_(config.sample_ranks()),
      sq_rank_(dp_.rank() % U_),
      n_(static_cast<size_t>(mb_) * T_),
      run_data_(open_run_data(config, dp_.size() / U_, dp_.rank() / U_)),
      planned_(plan_stage(config, stage_, dp_.rank(), tp_rank_)),
      tokens_(n_ * gas_),
      targets_(n_ * gas_),
      positions_(run_data_.splits.train->packed() ? n_ * gas_ : 0),
      losses_(gas_),
      engine_(device, dp_, config.engine),
      gpt_(configured_engine(), config.model, part_, tp_ > 1 ? groups_->tp.get() : nullptr, experts_.get(), sequence_.get()),
      stage_model_(make_stage_model()),
      saver_(config.run.checkpoint_async),
      tokens_per_step_(static_cast<double>(config.tokens_per_step())) {}

int TrainingRun::checked_rank(const TrainConfig& config, Communicator& world) {
  if (world.size() != config.run.world_size) {
    ZEROTH_THROW(ConfigError, "run.world_size is {} but the communicator has {} ranks", config.run.world_size, world.size());
  }
  return world.rank();
}

// The engine's groups before the model declares its blocks on it.
Engine& TrainingRun::configured_engine() {
  if (pp_ > 1) engine_.set_pipeline(*groups_->pp, planned_.plan.tied_block);
  if (runner_) engine_.set_pass_order(runner_->passes());
  if (tp_ > 1) engine_.set_tensor_parallel(*groups_->tp);
  return engine_;
}

// A pipeline stage's passes: the runner calls them in its schedule's order, with the tokens and
// targets of the cycle's micro-batches loaded before (an evaluation's in the first micro-batch's place).
PipeModel TrainingRun::make_stage_model() {
  PipeModel m;
  m.forward = [this](int micro, int c) {
    gpt_.forward_chunk(micro, c, tokens_.data() + micro * n_, targets_.data() + micro * n_, mb_, T_ / U_, &losses_[micro],
                       positions(micro));
  };
  m.backward = [this](int micro, int c) { gpt_.backward_chunk(micro, c); };
  m.evaluate = [this](int c) {
    gpt_.evaluate_chunk(c, tokens_.data(), targets_.data(), eval_rows_, T_ / U_, &losses_[0], positions(0));
  };
  m.port = [this](PipePort port, int micro, int c) {
    const Gpt::Port ports[] = {Gpt::Port::input, Gpt::Port::output, Gpt::Port::input_grad, Gpt::Port::output_grad};
    return gpt_.port(ports[static_cast<int>(port)], micro, c);
  };
  return m;
}

void TrainingRun::restore(bool for_eval) {
  summary_.parameters = config_.model.num_parameters();
  // A resumed run, or one starting from saved weights, sets every parameter itself.
  engine_.finalize(std::move(planned_.plan), planned_.model, config_.run.resume.empty() && config_.run.init_from.empty());
  if (!config_.run.resume.empty()) {
    ckpt::Manifest m;
    summary_.resume_io = ckpt::load(engine_, config_.run.resume, &m);
    summary_.resumed_from = summary_.resume_io.path;
    summary_.start_step = engine_.steps_run();
    // A job restarted after its last checkpoint (a rank lost between that save and the end) only
    // finishes: the weights and the summary, with no step left to run.
    const bool restarted = env::get_int(env::kRestartCount).value_or(0) > 0;
    if (!for_eval && !restarted && summary_.start_step >= config_.run.steps) {
      ZEROTH_THROW(ConfigError, "the checkpoint {} is at step {} and run.steps is {}: nothing is left to train; raise run.steps",
                   summary_.resumed_from, summary_.start_step, config_.run.steps);
    }
    const auto& r = m.run;
    nonfinite_ = r.value("nonfinite_steps", int64_t{0});
    last_finite_step_ = r.value("last_finite_step", int64_t{0});
    last_finite_loss_ = r.value("last_finite_loss", 0.0);
    const int64_t saved_batch = r.contains("data") ? r["data"].value("train_batch_size", int64_t{0}) : 0;
    if (lead_ && saved_batch != 0 && saved_batch != config_.train_batch_size) {
      ZLOG_WARN("resuming at step {} with train_batch_size {} where the checkpoint's run had {}: the data continues from sample {}, "
                "not from the {} samples that run had consumed",
                summary_.start_step, config_.train_batch_size, saved_batch, summary_.start_step * config_.train_batch_size,
                summary_.start_step * saved_batch);
    }
    return;
  }
  if (!config_.run.init_from.empty()) load_initial_weights(engine_, config_);
  if (!for_eval && lead_ && config_.model.lora.enabled() && config_.run.init_from.empty()) {
    ZLOG_WARN("lora trains adapters on a base model that run.init_from names, and none is named: the base is a fresh random "
              "initialization, frozen; set run.init_from to the weights to adapt (a Hugging Face folder or a run's folder)");
  }
  // Evaluating a LoRA run's folder reads its merged weights (run.init_from): the adapters it started
  // from are in them already.
  if (!config_.lora_init_from.empty() && !for_eval) load_lora_adapter(engine_, config_);
  if (!for_eval && lead_ && config_.run.checkpoint_interval >= 0 &&
      std::filesystem::exists(config_.run.checkpoint_dir + "/" + ckpt::kLatestName)) {
    ZLOG_WARN("{} holds checkpoints of an earlier run; this run's go beside them (a step folder of the same number is replaced, "
              "run.keep_last counts them all): use --resume to continue that run, or another run.checkpoint_dir",
              config_.run.checkpoint_dir);
  }
}

void TrainingRun::start() {
  // wall_clock_breakdown times Ulysses' exchanges within the passes too.
  gpt_.time_exchanges(config_.engine.time_breakdown && U_ > 1);
  const DataSplits& data = run_data_.splits;
  std::optional<corpus::SampleStats> samples;
  if (data.sample_stats != nullptr) samples = *data.sample_stats;
  const RunFacts facts{summary_.parameters,
                       data.train->tokens(),
                       data.has_val ? data.val->tokens() : 0,
                       data.train->size(),
                       data.has_val ? data.val->size() : 0,
                       planned_.need,
                       samples,
                       data.packing_fill};
  report([&] { observer_->on_start(config_, engine_.plan(), facts); });
  if (resumed()) report([&] { observer_->on_resume(summary_.resume_io, summary_.start_step); });
  shared_ = device_.allocate(2 * sizeof(float), MemTag::buffers);
}

std::pair<double, bool> TrainingRun::agree(double value, bool stop_here) {
  Stream& cs = engine_.compute_stream();
  float host[2] = {heads_ && tp_rank_ == 0 ? static_cast<float>(value) : 0.0f, stop_here ? 1.0f : 0.0f};
  device_.copy(cs, shared_.data(), host, sizeof host);
  world_.all_reduce(cs, shared_.view(DType::f32), ReduceOp::sum);
  device_.copy(cs, host, shared_.data(), sizeof host);
  cs.synchronize();
  return {host[0] / dp_.size(), host[1] > 0};
}

void TrainingRun::agree_moe(StepMetrics& s) {
  if (!config_.model.moe.enabled()) return;
  const MoeStats m = gpt_.take_moe_stats();  // this rank's layers (stages hold different ones)
  if (!moe_shared_) moe_shared_ = device_.allocate(8 * sizeof(float), MemTag::buffers);
  Stream& cs = engine_.compute_stream();
  float host[8] = {static_cast<float>(m.passes),  static_cast<float>(m.aux_loss), static_cast<float>(m.z_loss),
                   static_cast<float>(m.choices), static_cast<float>(m.dropped),  static_cast<float>(m.max_load)};
  const TensorView all = moe_shared_.view(DType::f32);
  device_.copy(cs, all.data, host, sizeof host);
  world_.all_reduce(cs, all.slice(0, 5), ReduceOp::sum);
  world_.all_reduce(cs, all.slice(5, 1), ReduceOp::max);
  device_.copy(cs, host, all.data, sizeof host);
  cs.synchronize();
  auto ratio = [](float a, float b) { return b > 0 ? a / b : 0.0; };
  s.moe = true, s.moe_max_load = host[5];
  s.moe_aux_loss = ratio(host[1], host[0]), s.moe_z_loss = ratio(host[2], host[0]), s.moe_dropped = ratio(host[4], host[3]);
}

void TrainingRun::evaluate(int64_t step) {
  if (!run_data_.splits.has_val) return;
  const EvalResult r = evaluate_windows(config_.run.eval_batches * mb_ * (dp_.size() / U_));
  if (summary_.first_val_loss < 0) summary_.first_val_loss = r.loss, summary_.first_val_step = step;
  summary_.last_val_loss = r.loss, summary_.last_val_step = step;
  report([&] { observer_->on_eval(step, r); });
}

void TrainingRun::evaluate_rows(int rows) {
  if (runner_) {
    eval_rows_ = rows;
    gpt_.prepare(rows, T_ / U_);
    engine_.begin_evaluation();
    runner_->run_evaluation(stage_model_);
    engine_.end_evaluation();
  } else {
    gpt_.evaluate(tokens_.data(), targets_.data(), rows, T_ / U_, &losses_[0], nullptr, positions(0));
  }
  // The loss is written by queued work; the next batch reuses the token buffers.
  engine_.compute_stream().synchronize();
}

EvalResult TrainingRun::evaluate_windows(int64_t most) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!run_data_.splits.has_val) {
    ZEROTH_THROW(ConfigError, "zeroth eval measures the validation data, and this config has none: set data.val (a token file or "
                              "text) or data.val_fraction");
  }
  const corpus::Rows& val = *run_data_.splits.val;
  EvalResult out;
  out.of = val.size();
  if (config_.data.format == DataFormat::jsonl) out.rows = val.packed() ? "packed rows" : "samples";
  out.windows = most > 0 ? std::min(most, out.of) : out.of;
  for (int64_t i = 0; i < out.windows; ++i) out.tokens += val.counted(i);
  if (out.windows == 0 || out.tokens == 0)
    ZEROTH_THROW(ConfigError, "the validation data holds no {} with a target that counts", val.unit());
  if (!shared_) shared_ = device_.allocate(2 * sizeof(float), MemTag::buffers);
  // Round r gives data-parallel rank d rows [r G + d mb, ...) with G = mb x dp. A round past the
  // end of the data still runs its passes (ZeRO's gathers are collective) at the full micro-batch,
  // on row 0 with every target masked: the training's shapes, so the activations it allocated serve
  // (a smaller batch would allocate its own beside them, which the run's estimate does not hold).
  // Each pass's loss is the sum over its counted targets (divisor 1); the mean is over all of them.
  const int64_t per_round = static_cast<int64_t>(mb_) * (dp_.size() / U_);
  const int64_t rounds = (out.windows + per_round - 1) / per_round;
  gpt_.set_loss_divisor(1);
  double sum = 0;  // this rank's counted targets' cross-entropy, summed
  for (int64_t r = 0; r < rounds; ++r) {
    const int64_t first = r * per_round + static_cast<int64_t>(dp_.rank() / U_) * mb_;
    const int count = static_cast<int>(std::clamp<int64_t>(out.windows - first, 0, mb_));
    for (int b = 0; b < mb_; ++b) {
      const size_t at = static_cast<size_t>(b) * T_;
      val.fill(b < count ? first + b : 0, tokens_.data() + at, targets_.data() + at, positions(0) ? positions(0) + at : nullptr);
      if (b >= count) std::fill_n(targets_.data() + at, T_, -1);
    }
    keep_positions(0, T_);
    evaluate_rows(mb_);
    sum += static_cast<double>(losses_[0]);
  }
  // Each rank's share of the mean, summed over the ranks that compute the loss.
  out.loss = agree(sum / static_cast<double>(out.tokens), false).first * dp_.size();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

void TrainingRun::published(const ckpt::IoStats& io) {
  summary_.last_save = io;
  ++summary_.checkpoints_saved;
  report([&] { observer_->on_checkpoint(io, saved_step_); });
}

void TrainingRun::save(int64_t step) {
  ckpt::SaveOptions o;
  o.dir = config_.run.checkpoint_dir;
  o.keep_last = static_cast<int>(config_.run.keep_last);
  o.config = config_.resolved;
  o.run = {{"data",
            {{"next_step", step},
             {"samples", step * config_.train_batch_size},
             {"train_batch_size", config_.train_batch_size},
             {"seed", config_.run.seed}}},
           {"nonfinite_steps", nonfinite_},
           {"last_finite_step", last_finite_step_},
           {"last_finite_loss", last_finite_loss_}};
  const ckpt::IoStats started = saver_.save(engine_, o);
  saved_step_ = step;
  if (!saver_.pending()) published(started);
  // The adapters as PEFT keeps them, beside the run's weights: the latest checkpoint's.
  if (config_.model.lora.enabled()) save_adapter();
}

void TrainingRun::save_adapter() {
  save_lora_adapter(engine_, config_.model, config_.run.output_dir, DType::f32,
                    {pp_ > 1 ? groups_->pp.get() : nullptr, part_, tp_ > 1 ? groups_->tp.get() : nullptr, experts_.get()},
                    config_.run.init_from);
}

namespace {

// Packed rows (positions restarting at 0 where a sample starts): the positions a token attends over,
// sum n^2 / sum n over the samples of lengths n (a micro-batch's rows stand for the step's).
int packed_context(const int32_t* positions, size_t count) {
  double squares = 0, tokens = 0, run = 0;
  for (size_t i = 0; i <= count; ++i) {
    if (i == count || positions[i] == 0) {
      squares += run * run, tokens += run;
      run = 0;
    }
    run += 1;
  }
  return tokens > 0 ? static_cast<int>(std::lround(squares / tokens)) : 0;
}

}  // namespace

void TrainingRun::run_passes(int64_t k, double pass_seconds[2]) {
  using Clock = std::chrono::steady_clock;
  Stream& cs = engine_.compute_stream();
  const bool timed = config_.engine.time_breakdown;
  if (runner_) {
    // A pipeline stage: the runner walks the schedule; the stamps give the step's bubble.
    set_loss_divisor(k);
    for (int m = 0; m < gas_; ++m) {
      run_data_.train.batch(k, m, tokens_.data() + m * n_, targets_.data() + m * n_, positions(m));
      keep_positions(m, T_);
    }
    gpt_.prepare(mb_, T_ / U_);
    runner_->set_tracing(true);
    runner_->run_cycle(stage_model_);
    // wall_clock_breakdown: the passes' own times come from the stamps; the step's "reduce wait"
    // is then only what follows the cycle's work, as without a pipeline.
    if (timed) cs.synchronize();
    return;
  }
  // The cycle's passes in the engine's order; the update comes after the last backward.
  set_loss_divisor(k);
  const int width = cycle_width(k);
  row_width_ = width;
  attention_context_ = 0;
  tokens_per_step_ = static_cast<double>(config_.tokens_per_step()) * width / T_;
  for (const auto& p : engine_.plan().passes) {
    const int m = p.micro;
    const auto start = Clock::now();
    if (p.pass == Pass::forward) {
      run_data_.train.batch(k, m, tokens_.data() + m * n_, targets_.data() + m * n_, positions(m));
      if (m == 0 && positions(0) != nullptr) attention_context_ = packed_context(positions(0), n_);
      cut_rows(m, width);
      keep_positions(m, width);
      gpt_.forward(m, tokens_.data() + m * n_, targets_.data() + m * n_, mb_, width / U_, &losses_[m], positions(m));
    } else {
      gpt_.backward(m);
    }
    if (timed) {
      // As DeepSpeed's timers do: a pass ends when its work has run, not when it is enqueued.
      cs.synchronize();
      pass_seconds[p.pass == Pass::forward ? 0 : 1] += std::chrono::duration<double>(Clock::now() - start).count();
    }
  }
}

int TrainingRun::cycle_width(int64_t k) {
  // A pipeline's stages exchange activations of the planned shape; token streams fill every row.
  if (runner_ || config_.data.format != DataFormat::jsonl) return T_;
  // Rounded up to 16 positions (and to the tensor-parallel and Ulysses ranks the rows are split
  // over), so a run sees few shapes.
  const int unit = 16 * (config_.parallel.sequence_parallel ? tp_ : 1) * U_;
  return std::min(T_, (run_data_.train.longest(k) + unit - 1) / unit * unit);
}

void TrainingRun::cut_rows(int m, int width) {
  if (width == T_) return;
  // Row b moves from b T to b width, towards the micro-batch's start: in order, nothing is
  // overwritten before it is read.
  for (int32_t* base : {tokens_.data() + m * n_, targets_.data() + m * n_, positions(m)}) {
    if (base == nullptr) continue;
    for (int b = 1; b < mb_; ++b)
      std::memmove(base + static_cast<size_t>(b) * width, base + static_cast<size_t>(b) * T_, width * sizeof(int32_t));
  }
}

void TrainingRun::keep_positions(int m, int width) {
  if (U_ == 1) return;
  // Row b's slices move to b w on (w = width / U_): Ulysses' one slice from b width + rank w, the
  // ring's two chunks of w / 2 from b width + rank w / 2 and b width + (2 U_ - 1 - rank) w / 2.
  // Towards the start, in order, so nothing is overwritten before it is read.
  const int w = width / U_;
  const bool ring = config_.parallel.context > 1;
  const int pieces = ring ? 2 : 1, piece = w / pieces;
  for (int32_t* base : {tokens_.data() + m * n_, targets_.data() + m * n_}) {
    for (int b = 0; b < mb_; ++b) {
      for (int slot = 0; slot < pieces; ++slot) {
        const int from = ring ? gpt::ring_chunk(U_, sq_rank_, slot) * piece : sq_rank_ * w;
        std::memmove(base + static_cast<size_t>(b) * w + static_cast<size_t>(slot) * piece,
                     base + static_cast<size_t>(b) * width + static_cast<size_t>(from), piece * sizeof(int32_t));
      }
    }
  }
}

void TrainingRun::set_loss_divisor(int64_t k) {
  // The mean count per micro-batch: each micro-batch's loss is then its share of the global
  // batch's mean over the targets that count, and the engine's sum over micro-batches and mean
  // over ranks make the whole.
  const int64_t counted = run_data_.train.counted(k);
  gpt_.set_loss_divisor(static_cast<double>(std::max<int64_t>(counted, 1)) / (static_cast<double>(gas_) * dp_.size()));
}

void TrainingRun::take_measure(int64_t k, double pass_seconds[2]) {
  PipeMeasure measured = runner_->measure(engine_.compute_stream());
  if (k > summary_.start_step || config_.run.steps - summary_.start_step == 1) bubbles_.push_back(measured.bubble);
  // wall_clock_breakdown: this stage's passes as its compute stream ran them.
  for (const auto& span : measured.spans.at(stage_)) {
    if (span.kind == SpanKind::forward || span.kind == SpanKind::backward)
      pass_seconds[span.kind == SpanKind::forward ? 0 : 1] += span.end - span.start;
  }
  summary_.bubble_formula = measured.formula;
  last_trace_ = std::move(measured);
}

void TrainingRun::report_step(int64_t k, double loss, double seconds, const StepResult& r, const double pass_seconds[2]) {
  StepMetrics s;
  agree_moe(s);  // a collective: every rank, before rank 0 reports
  // Every rank takes its exchanges' time (the passes were synchronized: wall_clock_breakdown).
  const double exchanges = config_.engine.time_breakdown && U_ > 1 ? gpt_.take_exchange_seconds() : -1;
  report([&] {
    s.step = k + 1;
    s.loss = loss;
    s.lr = r.lr;
    s.grad_norm = r.grad_norm;
    s.loss_scale = r.loss_scale;
    s.skipped = r.skipped;
    s.step_seconds = seconds;
    s.tokens_per_second = tokens_per_step_ / seconds;
    s.row_width = row_width_;
    s.attention_context = attention_context_;
    s.peak_bytes = device_.memory().stats().total_peak;
    s.forward_seconds = pass_seconds[0];
    s.backward_seconds = pass_seconds[1];
    s.sequence_exchange_seconds = exchanges;
    s.sequence_ring = config_.parallel.context > 1;
    s.reduce_wait_seconds = r.reduce_wait_seconds;
    s.optimizer_seconds = r.update_seconds;
    s.swap_read_bytes = r.swap_read_bytes;
    s.swap_write_bytes = r.swap_write_bytes;
    s.swap_busy_seconds = r.swap_busy_seconds;
    s.optimizer_swap_read_bytes = r.update_swap_read_bytes;
    s.optimizer_swap_write_bytes = r.update_swap_write_bytes;
    s.speculation = r.speculation;
    s.update_delayed = r.update_delayed;
    observer_->on_step(s);
  });
}

void TrainingRun::count_nonfinite(int64_t k, const StepResult& r) {
  // The skip is the same on every rank (a global norm), so every rank ends here together.
  // A dynamic f16 scale still has room to fall until it reaches its minimum; a static one never moves.
  const bool dynamic_f16 = config_.engine.compute_dtype == DType::f16 && config_.engine.loss_scaler.loss_scale == 0.0;
  const bool stuck = r.skipped && (!dynamic_f16 || r.loss_scale <= config_.engine.loss_scaler.min_loss_scale);
  nonfinite_ = stuck ? nonfinite_ + 1 : r.skipped ? nonfinite_ : 0;
  if (config_.run.max_nonfinite_steps > 0 && nonfinite_ >= config_.run.max_nonfinite_steps) {
    ZEROTH_THROW(NumericError,
                 "steps {} to {}: the gradients held Inf or NaN {} steps in a row (run.max_nonfinite_steps = {}){}; the run stops. "
                 "Lower the learning rate, turn on gradient_clipping, or train in bf16 instead of fp16",
                 k + 2 - nonfinite_, k + 1, nonfinite_, config_.run.max_nonfinite_steps,
                 last_finite_step_ > 0
                     ? fmt::format("; the last finite loss was {:.4f} at step {}", last_finite_loss_, last_finite_step_)
                     : std::string("; no step had a finite loss"));
  }
}

}  // namespace zeroth
