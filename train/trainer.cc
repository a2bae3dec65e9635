// The loop: per optimizer step, gradient_accumulation micro-steps of forward+backward, the
// engine's step, one small all-reduce for the mean loss and the stop flag, then reporting.
#include "train/trainer.h"

#include "train/export.h"  // save_gpt_weights

#include <algorithm>   // std::max
#include <chrono>      // std::chrono::steady_clock
#include <cmath>       // std::isfinite
#include <exception>   // std::exception_ptr
#include <filesystem>  // std::filesystem::is_directory
#include <vector>      // std::vector

#include <fmt/format.h>  // fmt::format

#include "core/error.h"         // ZEROTH_THROW
#include "core/memory.h"        // format_bytes
#include "core/log.h"           // ZLOG_WARN
#include "core/stats.h"         // median
#include "engine/checkpoint/checkpoint.h"  // save_checkpoint, load_checkpoint
#include "engine/engine.h"      // Engine
#include "engine/plan/estimate.h"    // estimate
#include "engine/pipeline/runner.h"    // PipelineRunner
#include "comm/process_grid.h"  // ProcessGrid
#include "models/gpt/gpt.h"     // Gpt
#include "train/data.h"         // TokenData, Loader

namespace zeroth {
namespace {

struct Splits {
  TokenData train, val;
  bool has_val = false;
};

Splits load_data(const TrainConfig& c) {
  Splits s;
  const auto& d = c.data;
  auto open = [&](const std::string& path) {
    return d.format == DataFormat::bin ? TokenData::open_bin(path) : TokenData::open_text(path);
  };
  TokenData all = d.format == DataFormat::synthetic ? TokenData::synthetic(d.vocab_size, d.synthetic_tokens, c.run.seed)
                                                    : open(d.train);
  if (!d.val.empty()) {
    s.train = all;
    s.val = open(d.val);
    s.has_val = true;
  } else if (d.val_fraction > 0) {
    // The tail is held out; at least one sequence of it.
    const size_t need = static_cast<size_t>(c.model.seq_len) + 1;
    size_t n_val = std::max(need, static_cast<size_t>(static_cast<double>(all.size()) * d.val_fraction));
    if (n_val + need > all.size()) {
      ZEROTH_THROW(ConfigError,
                   "{}: {} tokens are too few to hold out data.val_fraction = {} and still train on sequences of {} tokens; give more "
                   "data, a data.val file, or data.val_fraction = 0",
                   d.train.empty() ? "synthetic data" : d.train, all.size(), d.val_fraction, need);
    }
    s.train = all.slice(0, all.size() - n_val);
    s.val = all.slice(all.size() - n_val, all.size());
    s.has_val = true;
  } else {
    s.train = all;
  }
  const int vmax = std::max(s.train.max_token(), s.has_val ? s.val.max_token() : 0);
  if (vmax >= c.model.vocab_size) {
    ZEROTH_THROW(ConfigError, "the data holds token id {} but model.vocab_size is {}; raise model.vocab_size above {}", vmax,
                 c.model.vocab_size, vmax);
  }
  return s;
}

struct RunData {
  Splits splits;
  Loader train;
  std::unique_ptr<Loader> val;
};

RunData open_data(const TrainConfig& config, int dp, int rank) {
  const int mb = static_cast<int>(config.micro_batch_size), T = config.model.seq_len;
  Splits data = load_data(config);
  Loader train_loader(data.train, T, mb, static_cast<int>(config.engine.gradient_accumulation_steps), dp, rank, config.run.seed, true);
  std::unique_ptr<Loader> val_loader;
  if (data.has_val) {
    val_loader = std::make_unique<Loader>(data.val, T, mb, static_cast<int>(config.run.eval_batches), dp, rank, 0, false);
  }
  return {std::move(data), std::move(train_loader), std::move(val_loader)};
}

// run.init_from: a zeroth checkpoint's weights, or a GPT-2 safetensors file read block by block
// (every rank reads the same file, so they fail or succeed together).
void init_weights(Engine& engine, const TrainConfig& config) {
  const std::string& from = config.run.init_from;
  if (std::filesystem::is_directory(from)) {
    load_checkpoint(engine, from, nullptr, true);
    return;
  }
  // The file's tensors come block by block (the whole model's blocks), each block's in its
  // parameters' order: what set_master_values takes, for the blocks this rank holds (a pipeline
  // stage's, found by name).
  const auto whole = Gpt::block_specs(config.model);
  int block = -1;
  std::vector<float> values;
  auto flush = [&] {
    if (block < 0) return;
    const auto& blocks = engine.plan().blocks;
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (blocks[b].name == whole[block].name) engine.set_master_values(static_cast<int>(b), values);
    }
  };
  read_gpt2_weights(config.model, from, [&](int b, size_t i, std::vector<float>& param) {
    if (b != block) {
      flush();
      block = b;
      values.clear();
    }
    // A tensor-parallel rank takes its slice of each tensor (the block's spec says which).
    const auto& blocks = engine.plan().blocks;
    const ParamSpec* spec = nullptr;
    for (size_t k = 0; k < blocks.size() && spec == nullptr; ++k) {
      if (blocks[k].name == whole[b].name) spec = &engine.block_spec(static_cast<int>(k)).params.at(i);
    }
    if (spec == nullptr || !spec->tp.split()) {
      values.insert(values.end(), param.begin(), param.end());
      return;
    }
    const size_t at = values.size();
    values.resize(at + spec->numel());
    spec->tp.take(param.data(), values.data() + at, spec->numel());
  });
  flush();
  engine.release_transfer_buffers();
}

}  // namespace

void check_data(const TrainConfig& config) { open_data(config, config.data_parallel(), 0); }

StagePlan plan_stage(const TrainConfig& config, int stage, int dp_rank, int tp_rank) {
  const int pp = config.parallel.pipeline;
  const GptPart part = config.part(stage, tp_rank);
  std::vector<PassRef> passes;
  if (pp > 1) {
    passes = pipe_passes(make_pipe_schedule(config.parallel.schedule, pp, static_cast<int>(config.engine.gradient_accumulation_steps),
                                            config.parallel.virtual_stages),
                         stage);
  }
  StagePlan out;
  out.plan = make_plan(Gpt::block_specs(config.model, part), Gpt::schedules(config.model, part), config.engine, config.data_parallel(),
                       dp_rank, passes);
  if (pp > 1 && (stage == 0 || stage == pp - 1)) tie_block(out.plan, Gpt::embedding_block(config.model, part), stage == 0);
  out.plan.stages = pp;
  out.model = Gpt::footprint(config.model, static_cast<int>(config.micro_batch_size), config.model.seq_len,
                             config.engine.compute_dtype, out.plan.chunk_in_flight, part);
  out.need = estimate(out.plan, out.model);
  return out;
}

StagePlan largest_stage(const TrainConfig& config, int* stage) {
  StagePlan best;
  for (int s = 0; s < config.parallel.pipeline; ++s) {
    StagePlan p = plan_stage(config, s, 0);
    if (s == 0 || p.need.total(Tier::device) > best.need.total(Tier::device)) {
      best = std::move(p);
      if (stage != nullptr) *stage = s;
    }
  }
  return best;
}

TrainSummary train(const TrainConfig& config, Communicator& world, Device& device, TrainObserver* observer,
                   const std::atomic<bool>* stop) {
  const bool lead = world.rank() == 0;
  if (world.size() != config.run.world_size) {
    ZEROTH_THROW(ConfigError, "run.world_size is {} but the communicator has {} ranks", config.run.world_size, world.size());
  }
  // Pipelines and tensor parallelism: ranks are laid out as ProcessGrid(dp, pp, tp) and ZeRO
  // partitions over the data-parallel group of each (stage, tensor-parallel rank); without either
  // the world is the data-parallel group.
  const int pp = config.parallel.pipeline, tp = config.parallel.tensor;
  std::optional<ProcessGrid::Groups> groups;
  if (pp > 1 || tp > 1) groups = ProcessGrid(config.data_parallel(), pp, tp).split(world);
  Communicator& dp = groups ? *groups->dp : world;
  const int stage = groups ? groups->pp->rank() : 0, tp_rank = groups ? groups->tp->rank() : 0;
  const GptPart part = config.part(stage, tp_rank);
  std::unique_ptr<PipelineRunner> runner;
  if (pp > 1) {
    const int micro = static_cast<int>(config.engine.gradient_accumulation_steps);
    runner = std::make_unique<PipelineRunner>(device, *groups->pp,
                                              make_pipe_schedule(config.parallel.schedule, pp, micro, config.parallel.virtual_stages));
  }
  const bool heads = part.has_head(config.model);  // this stage computes the loss
  const int mb = static_cast<int>(config.micro_batch_size), T = config.model.seq_len;
  const int gas = static_cast<int>(config.engine.gradient_accumulation_steps);
  RunData run_data = open_data(config, dp.size(), dp.rank());
  const Splits& data = run_data.splits;
  Loader& train_loader = run_data.train;
  std::unique_ptr<Loader>& val_loader = run_data.val;

  // Planned once. The engine holds the whole need per rank (its plan, the model's activations
  // and scratch) against the budgets before anything is allocated.
  StagePlan planned = plan_stage(config, stage, dp.rank(), tp_rank);
  Plan plan = std::move(planned.plan);
  const int tied = plan.tied_block;
  const ModelFootprint model = planned.model;
  const MemoryNeed need = planned.need;
  TrainSummary summary;
  // The micro-batches' tokens and losses, before the model: its queued work reads and writes them
  // until its destructor has waited for it, also when a step fails.
  const size_t n = static_cast<size_t>(mb) * T;
  std::vector<int32_t> tokens(n * gas), targets(n * gas);
  std::vector<float> losses(std::max<int64_t>(gas, config.run.eval_batches));
  Engine engine(device, dp, config.engine);
  if (pp > 1) engine.set_pipeline(*groups->pp, tied);
  if (runner) engine.set_pass_order(runner->passes());
  if (tp > 1) engine.set_tensor_parallel(*groups->tp);
  Gpt gpt(engine, config.model, part, tp > 1 ? groups->tp.get() : nullptr);
  // The runner's channels move data in the model's buffers: it goes first, also on an error.
  struct RunnerFirst {
    std::unique_ptr<PipelineRunner>& runner;
    ~RunnerFirst() { runner.reset(); }
  } runner_first{runner};
  summary.parameters = config.model.num_parameters();
  // A resumed run, or one starting from saved weights, sets every parameter itself.
  engine.finalize(std::move(plan), model, config.run.resume.empty() && config.run.init_from.empty());
  // Rank 0's observer writes the run's files; a failure there (disk full, read-only) is kept and
  // every rank stops at the next agreement, so no rank waits in a collective for rank 0.
  std::exception_ptr report_error;
  auto report = [&](auto&& fn) {
    if (!lead || observer == nullptr || report_error) return;
    try {
      fn();
    } catch (...) {
      report_error = std::current_exception();
    }
  };
  // Resumed: the engine's state, counters and the loop's own from the checkpoint, before anything
  // of the output folder is replaced.
  int64_t nonfinite = 0, last_finite_step = 0;
  double last_finite_loss = 0;
  if (!config.run.resume.empty()) {
    Manifest m;
    summary.resume_io = load_checkpoint(engine, config.run.resume, &m);
    summary.resumed_from = summary.resume_io.path;
    summary.start_step = engine.steps_run();
    if (summary.start_step >= config.run.steps) {
      ZEROTH_THROW(ConfigError, "the checkpoint {} is at step {} and run.steps is {}: nothing is left to train; raise run.steps",
                   summary.resumed_from, summary.start_step, config.run.steps);
    }
    const auto& r = m.run;
    nonfinite = r.value("nonfinite_steps", int64_t{0});
    last_finite_step = r.value("last_finite_step", int64_t{0});
    last_finite_loss = r.value("last_finite_loss", 0.0);
    const int64_t saved_batch = r.contains("data") ? r["data"].value("train_batch_size", int64_t{0}) : 0;
    if (lead && saved_batch != 0 && saved_batch != config.train_batch_size) {
      ZLOG_WARN("resuming at step {} with train_batch_size {} where the checkpoint's run had {}: the data continues from sample {}, "
                "not from the {} samples that run had consumed",
                summary.start_step, config.train_batch_size, saved_batch, summary.start_step * config.train_batch_size,
                summary.start_step * saved_batch);
    }
  }
  if (config.run.resume.empty() && !config.run.init_from.empty()) init_weights(engine, config);
  if (config.run.resume.empty() && lead && config.run.checkpoint_interval >= 0 &&
      std::filesystem::exists(config.run.checkpoint_dir + "/" + kLatestName)) {
    ZLOG_WARN("{} holds checkpoints of an earlier run; this run's go beside them (a step folder of the same number is replaced, "
              "run.keep_last counts them all): use --resume to continue that run, or another run.checkpoint_dir",
              config.run.checkpoint_dir);
  }
  const RunFacts facts{summary.parameters, data.train.size(), data.has_val ? data.val.size() : 0, need};
  report([&] { observer->on_start(config, engine.plan(), facts); });
  if (!summary.resumed_from.empty()) report([&] { observer->on_resume(summary.resume_io, summary.start_step); });

  Buffer shared = device.allocate(2 * sizeof(float), MemTag::buffers);
  Stream& cs = engine.compute_stream();

  // Mean of the loss over the data-parallel ranks of the stage that computes it (its tensor-parallel
  // ranks all hold the same), and whether any rank asked to stop, on the compute stream over the
  // world: the engine's own collectives travel on communicators split from dp.
  auto agree = [&](double value, bool stop_here) {
    float host[2] = {heads && tp_rank == 0 ? static_cast<float>(value) : 0.0f, stop_here ? 1.0f : 0.0f};
    device.copy(cs, shared.data(), host, sizeof host);
    world.all_reduce(cs, shared.view(DType::f32), ReduceOp::sum);
    device.copy(cs, host, shared.data(), sizeof host);
    cs.synchronize();
    return std::pair<double, bool>{host[0] / dp.size(), host[1] > 0};
  };
  // A pipeline stage's passes: the runner calls them in its schedule's order, with the tokens and
  // targets of the cycle's micro-batches loaded before (eval_batch: the evaluation's).
  int eval_batch = 0;
  PipeModel stage_model;
  stage_model.forward = [&](int m, int c) {
    gpt.forward_chunk(m, c, tokens.data() + m * n, targets.data() + m * n, mb, T, &losses[m]);
  };
  stage_model.backward = [&](int m, int c) { gpt.backward_chunk(m, c); };
  stage_model.evaluate = [&](int c) { gpt.evaluate_chunk(c, tokens.data(), targets.data(), mb, T, &losses[eval_batch]); };
  stage_model.port = [&](PipePort port, int m, int c) {
    const Gpt::Port ports[] = {Gpt::Port::input, Gpt::Port::output, Gpt::Port::input_grad, Gpt::Port::output_grad};
    return gpt.port(ports[static_cast<int>(port)], m, c);
  };
  auto evaluate = [&](int64_t step) {
    if (!val_loader) return;
    for (int m = 0; m < config.run.eval_batches; ++m) {
      val_loader->batch(0, m, tokens.data(), targets.data());
      if (runner) {
        eval_batch = m;
        gpt.prepare(mb, T);
        engine.begin_evaluation();
        runner->run_evaluation(stage_model);
        engine.end_evaluation();
      } else {
        gpt.evaluate(tokens.data(), targets.data(), mb, T, &losses[m]);
      }
      cs.synchronize();  // the next batch reuses the token buffers
    }
    double sum = 0;
    for (int m = 0; m < config.run.eval_batches; ++m) sum += losses[m];
    const double val = agree(sum / static_cast<double>(config.run.eval_batches), false).first;
    if (summary.first_val_loss < 0) summary.first_val_loss = val;
    summary.last_val_loss = val;
    report([&] { observer->on_eval(step, val); });
  };

  // What a checkpoint keeps of the loop: the data position (a function of the step, see
  // train/data.h) and the non-finite streak. An asynchronous save is published after the next
  // step, or before the run ends.
  CheckpointSaver saver(config.run.checkpoint_async);
  int64_t saved_step = 0;
  auto published = [&](const CheckpointIo& io) {
    summary.last_save = io;
    ++summary.checkpoints_saved;
    report([&] { observer->on_checkpoint(io, saved_step); });
  };
  auto save = [&](int64_t step) {
    CheckpointSaveOptions o;
    o.dir = config.run.checkpoint_dir;
    o.keep_last = static_cast<int>(config.run.keep_last);
    o.config = config.resolved;
    o.run = {{"data",
              {{"next_step", step},
               {"samples", step * config.train_batch_size},
               {"train_batch_size", config.train_batch_size},
               {"seed", config.run.seed}}},
             {"nonfinite_steps", nonfinite},
             {"last_finite_step", last_finite_step},
             {"last_finite_loss", last_finite_loss}};
    const CheckpointIo started = saver.save(engine, o);
    saved_step = step;
    if (!saver.pending()) published(started);
  };

  if (summary.resumed_from.empty()) evaluate(0);
  std::vector<double> rates, bubbles;
  PipeMeasure last_trace;
  const double tokens_per_step = static_cast<double>(config.tokens_per_step());
  const bool timed = config.engine.time_breakdown;
  using Clock = std::chrono::steady_clock;
  for (int64_t k = summary.start_step; k < config.run.steps; ++k) {
    const auto t0 = Clock::now();
    double pass_seconds[2] = {0, 0};  // forward, backward
    if (runner) {
      // A pipeline stage: the runner walks the schedule; the stamps give the step's bubble.
      for (int m = 0; m < gas; ++m) train_loader.batch(k, m, tokens.data() + m * n, targets.data() + m * n);
      gpt.prepare(mb, T);
      runner->set_tracing(true);
      runner->run_cycle(stage_model);
      // wall_clock_breakdown: the passes' own times come from the stamps; the step's "reduce wait"
      // is then only what follows the cycle's work, as without a pipeline.
      if (timed) cs.synchronize();
    }
    // The cycle's passes in the engine's order; the update comes after the last backward.
    for (const auto& p : runner ? std::vector<PassRef>{} : engine.plan().passes) {
      const int m = p.micro;
      const auto start = Clock::now();
      if (p.pass == Pass::forward) {
        train_loader.batch(k, m, tokens.data() + m * n, targets.data() + m * n);
        gpt.forward(m, tokens.data() + m * n, targets.data() + m * n, mb, T, &losses[m]);
      } else {
        gpt.backward(m);
      }
      if (timed) {
        // As DeepSpeed's timers do: a pass ends when its work has run, not when it is enqueued.
        cs.synchronize();
        pass_seconds[p.pass == Pass::forward ? 0 : 1] += std::chrono::duration<double>(Clock::now() - start).count();
      }
    }
    // The step's span on the compute stream: from where the stream reaches it to its end.
    std::function<void()> close_step = runner ? runner->open_span(cs, SpanKind::optimizer) : [] {};
    const StepResult r = engine.step();
    close_step();
    cs.synchronize();
    if (runner) {
      PipeMeasure measured = runner->measure(cs);
      if (k > summary.start_step || config.run.steps - summary.start_step == 1) bubbles.push_back(measured.bubble);
      // wall_clock_breakdown: this stage's passes as its compute stream ran them.
      for (const auto& span : measured.spans.at(stage)) {
        if (span.kind == SpanKind::forward || span.kind == SpanKind::backward)
          pass_seconds[span.kind == SpanKind::forward ? 0 : 1] += span.end - span.start;
      }
      summary.bubble_formula = measured.formula;
      last_trace = std::move(measured);
    }
    if (saver.pending()) published(saver.complete(engine));
    double sum = 0;
    for (int m = 0; m < gas; ++m) sum += losses[m];
    const auto [loss, stopping] = agree(sum / gas, (stop != nullptr && stop->load()) || report_error != nullptr);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    summary.seconds += seconds;
    if (k > summary.start_step) rates.push_back(tokens_per_step / seconds);
    if (k == summary.start_step) summary.first_loss = loss;
    summary.last_loss = loss;
    summary.steps = k + 1;
    report([&] {
      StepMetrics s;
      s.step = k + 1;
      s.loss = loss;
      s.lr = r.lr;
      s.grad_norm = r.grad_norm;
      s.loss_scale = r.loss_scale;
      s.skipped = r.skipped;
      s.step_seconds = seconds;
      s.tokens_per_second = tokens_per_step / seconds;
      s.peak_bytes = device.memory().stats().total_peak;
      s.forward_seconds = pass_seconds[0];
      s.backward_seconds = pass_seconds[1];
      s.reduce_wait_seconds = r.reduce_wait_seconds;
      s.optimizer_seconds = r.update_seconds;
      s.swap_read_bytes = r.swap_read_bytes;
      s.swap_write_bytes = r.swap_write_bytes;
      s.swap_busy_seconds = r.swap_busy_seconds;
      s.optimizer_swap_read_bytes = r.update_swap_read_bytes;
      s.optimizer_swap_write_bytes = r.update_swap_write_bytes;
      observer->on_step(s);
    });
    // The skip is the same on every rank (a global norm), so every rank ends here together.
    // A dynamic f16 scale still has room to fall until it reaches its minimum; a static one never moves.
    const bool dynamic_f16 = config.engine.compute_dtype == DType::f16 && config.engine.loss_scaler.loss_scale == 0.0;
    const bool stuck = r.skipped && (!dynamic_f16 || r.loss_scale <= config.engine.loss_scaler.min_loss_scale);
    nonfinite = stuck ? nonfinite + 1 : r.skipped ? nonfinite : 0;
    if (config.run.max_nonfinite_steps > 0 && nonfinite >= config.run.max_nonfinite_steps) {
      ZEROTH_THROW(NumericError,
                   "steps {} to {}: the gradients held Inf or NaN {} steps in a row (run.max_nonfinite_steps = {}){}; the run stops. "
                   "Lower the learning rate, turn on gradient_clipping, or train in bf16 instead of fp16",
                   k + 2 - nonfinite, k + 1, nonfinite, config.run.max_nonfinite_steps,
                   last_finite_step > 0
                       ? fmt::format("; the last finite loss was {:.4f} at step {}", last_finite_loss, last_finite_step)
                       : std::string("; no step had a finite loss"));
    }
    if (std::isfinite(loss)) last_finite_loss = loss, last_finite_step = k + 1;
    if (stopping) {
      summary.interrupted = true;
      if (!report_error && config.run.checkpoint_interval >= 0) save(k + 1);
      break;
    }
    const bool last = k + 1 == config.run.steps;
    if (last || (config.run.eval_interval > 0 && (k + 1) % config.run.eval_interval == 0)) evaluate(k + 1);
    const int64_t every = config.run.checkpoint_interval;
    if (every >= 0 && (last || (every > 0 && (k + 1) % every == 0))) save(k + 1);
  }
  if (saver.pending()) published(saver.complete(engine));
  if (report_error) std::rethrow_exception(report_error);
  // A run, finished or stopped, leaves its weights: fp32 master weights, or the compute dtype's
  // with stage3_gather_16bit_weights_on_model_save as in DeepSpeed.
  summary.peak_rss_before_save = process_peak_rss();
  summary.weights_path = config.run.output_dir + "/model.safetensors";
  summary.weights_dtype = config.engine.zero.gather_16bit_weights_on_model_save ? config.engine.compute_dtype : DType::f32;
  const auto save_start = Clock::now();
  summary.weights_bytes = save_gpt_weights(engine, config.model, summary.weights_path, summary.weights_dtype,
                                           {pp > 1 ? groups->pp.get() : nullptr, part, tp > 1 ? groups->tp.get() : nullptr});
  summary.weights_seconds = std::chrono::duration<double>(Clock::now() - save_start).count();
  summary.tokens_per_second = rates.empty() ? tokens_per_step / std::max(summary.seconds, 1e-9) : median(rates);
  const auto stats = device.memory().stats();
  summary.peak = stats.peak;
  summary.peak_total = stats.total_peak;
  summary.host_peak = engine.tier_stats(Tier::host).total_peak;
  summary.swap_bytes = tier_total(engine.plan().bytes, Tier::nvme);
  summary.swap_disk_bytes = engine.swap_disk_bytes();
  summary.peak_rss = process_peak_rss();
  if (runner) {
    summary.pipeline_bubble = bubbles.empty() ? 0 : median(bubbles);
    // Each stage's activation peak (its data-parallel rank 0's), gathered over the world.
    Buffer peaks = device.allocate(world.size() * sizeof(float), MemTag::buffers);
    device.fill(cs, peaks.view(DType::f32), 0.0f);
    const float mine = static_cast<float>(stats.peak[static_cast<size_t>(MemTag::activations)]);
    device.copy(cs, peaks.as<float>() + world.rank(), &mine, sizeof mine);
    world.all_gather(cs, {peaks.as<float>() + world.rank(), 1, DType::f32}, peaks.view(DType::f32));
    std::vector<float> all(world.size());
    device.copy(cs, all.data(), peaks.data(), all.size() * sizeof(float));
    cs.synchronize();
    const ProcessGrid grid(config.data_parallel(), pp, tp);
    for (int s = 0; s < pp; ++s) summary.stage_activation_peak.push_back(static_cast<size_t>(all[grid.rank_of({0, s, 0})]));
    if (config.run.trace && lead) summary.trace = chrome_trace(last_trace);
  }
  if (tp > 1) summary.tensor_traffic = groups->tp->stats();
  if (lead && observer != nullptr) observer->on_end(summary);
  return summary;
}

}  // namespace zeroth
