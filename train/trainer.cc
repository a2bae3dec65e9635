// The loop: per optimizer step, gradient_accumulation micro-steps of forward+backward, the
// engine's step, one small all-reduce for the mean loss and the stop flag, then reporting.
#include "train/trainer.h"

#include "train/training_run.h"  // TrainingRun

#include "train/hf/export.h"  // save_gpt_weights

#include <algorithm>   // std::max
#include <chrono>      // std::chrono::steady_clock
#include <cmath>       // std::isfinite
#include <exception>   // std::exception_ptr
#include <filesystem>  // std::filesystem::is_directory
#include <functional>  // std::function
#include <optional>    // std::optional
#include <vector>      // std::vector

#include <fmt/format.h>  // fmt::format

#include "core/error.h"                    // ZEROTH_THROW
#include "core/memory.h"                   // format_bytes
#include "core/log.h"                      // ZLOG_WARN
#include "core/stats.h"                    // median
#include "engine/checkpoint/checkpoint.h"  // ckpt::save, ckpt::load
#include "engine/engine.h"                 // Engine
#include "engine/plan/estimate.h"          // estimate
#include "engine/pipeline/runner.h"        // PipelineRunner
#include "comm/process_grid.h"             // ProcessGrid
#include "models/decoder/gpt.h"            // Gpt
#include "train/data.h"                    // RunData, open_run_data

namespace zeroth {

bool TrainingRun::step(int64_t k) {
  using Clock = std::chrono::steady_clock;
  Stream& cs = engine_.compute_stream();
  const auto t0 = Clock::now();
  double pass_seconds[2] = {0, 0};  // forward, backward
  const StepResult r = in_phase(fmt::format("step {}", k + 1), [&] {
    run_passes(k, pass_seconds);
    // The step's span on the compute stream: from where the stream reaches it to its end.
    std::function<void()> close_step = runner_ ? runner_->open_span(cs, SpanKind::optimizer) : [] {};
    const StepResult result = engine_.step();
    close_step();
    cs.synchronize();
    return result;
  });
  if (runner_) take_measure(k, pass_seconds);
  if (saver_.pending()) published(saver_.complete(engine_));
  double sum = 0;
  for (int m = 0; m < gas_; ++m) sum += losses_[m];
  const auto [loss, stopping] = agree(sum / gas_, (stop_ != nullptr && stop_->load()) || report_error_ != nullptr);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  summary_.seconds += seconds;
  if (k > summary_.start_step) rates_.push_back(tokens_per_step_ / seconds);
  if (k == summary_.start_step) summary_.first_loss = loss;
  summary_.last_loss = loss;
  summary_.steps = k + 1;
  report_step(k, loss, seconds, r, pass_seconds);
  count_nonfinite(k, r);
  if (std::isfinite(loss)) last_finite_loss_ = loss, last_finite_step_ = k + 1;
  if (stopping) {
    summary_.interrupted = true;
    if (!report_error_ && config_.run.checkpoint_interval >= 0) save(k + 1);
    return false;
  }
  const bool last = k + 1 == config_.run.steps;
  if (last || (config_.run.eval_interval > 0 && (k + 1) % config_.run.eval_interval == 0))
    in_phase(fmt::format("validation at step {}", k + 1), [&] { evaluate(k + 1); });
  const int64_t every = config_.run.checkpoint_interval;
  if (every >= 0 && (last || (every > 0 && (k + 1) % every == 0)))
    in_phase(fmt::format("the checkpoint of step {}", k + 1), [&] { save(k + 1); });
  return true;
}

TrainSummary TrainingRun::finish() {
  using Clock = std::chrono::steady_clock;
  if (saver_.pending()) published(saver_.complete(engine_));
  if (report_error_) std::rethrow_exception(report_error_);
  // A run, finished or stopped, leaves its weights: fp32 master weights, or the compute dtype's
  // with stage3_gather_16bit_weights_on_model_save as in DeepSpeed.
  TrainSummary& summary = summary_;
  summary.peak_rss_before_save = process_peak_rss();
  summary.weights_path = config_.run.output_dir + "/model.safetensors";
  summary.weights_dtype = config_.engine.zero.gather_16bit_weights_on_model_save ? config_.engine.compute_dtype : DType::f32;
  const auto save_start = Clock::now();
  summary.weights_bytes = in_phase("gathering the trained weights into " + summary.weights_path, [&] {
    return save_gpt_weights(engine_, config_.model, summary.weights_path, summary.weights_dtype,
                            {pp_ > 1 ? groups_->pp.get() : nullptr, part_, tp_ > 1 ? groups_->tp.get() : nullptr, experts_.get()});
  });
  if (config_.model.lora.enabled()) in_phase("writing the LoRA adapters into " + config_.run.output_dir, [&] { save_adapter(); });
  summary.weights_seconds = std::chrono::duration<double>(Clock::now() - save_start).count();
  summary.tokens_per_second = rates_.empty() ? tokens_per_step_ / std::max(summary.seconds, 1e-9) : median(rates_);
  const auto stats = device_.memory().stats();
  summary.peak = stats.peak;
  summary.peak_total = stats.total_peak;
  summary.host_peak = engine_.tier_stats(Tier::host).total_peak;
  summary.swap_bytes = tier_total(engine_.plan().bytes, Tier::nvme);
  summary.swap_disk_bytes = engine_.swap_disk_bytes();
  summary.peak_rss = process_peak_rss();
  if (runner_) {
    Stream& cs = engine_.compute_stream();
    summary.pipeline_bubble = bubbles_.empty() ? 0 : median(bubbles_);
    // Each stage's activation peak (its data-parallel rank 0's), gathered over the world.
    Buffer peaks = device_.allocate(world_.size() * sizeof(float), MemTag::buffers);
    device_.fill(cs, peaks.view(DType::f32), 0.0f);
    const float mine = static_cast<float>(stats.peak[static_cast<size_t>(MemTag::activations)]);
    device_.copy(cs, peaks.as<float>() + world_.rank(), &mine, sizeof mine);
    world_.all_gather(cs, {peaks.as<float>() + world_.rank(), 1, DType::f32}, peaks.view(DType::f32));
    std::vector<float> all(world_.size());
    device_.copy(cs, all.data(), peaks.data(), all.size() * sizeof(float));
    cs.synchronize();
    const ProcessGrid grid(config_.data_parallel(), pp_, tp_);
    for (int s = 0; s < pp_; ++s) summary.stage_activation_peak.push_back(static_cast<size_t>(all[grid.rank_of({0, s, 0})]));
    if (config_.run.trace && lead_) summary.trace = chrome_trace(last_trace_);
  }
  if (tp_ > 1) summary.tensor_traffic = groups_->tp->stats();
  if (lead_ && observer_ != nullptr) observer_->on_end(summary);
  return std::move(summary_);
}

EvalResult evaluate(const TrainConfig& config, Communicator& world, Device& device, int64_t windows) {
  TrainingRun run(config, world, device, nullptr, nullptr);
  run.restore(true);
  return run.evaluate_windows(windows);
}

TrainSummary train(const TrainConfig& config, Communicator& world, Device& device, TrainObserver* observer,
                   const std::atomic<bool>* stop) {
  TrainingRun run(config, world, device, observer, stop);
  run.restore();
  run.start();
  if (!run.resumed()) in_phase("validation at step 0", [&] { run.evaluate(0); });
  for (int64_t k = run.first_step(); k < config.run.steps; ++k) {
    if (!run.step(k)) break;
  }
  return run.finish();
}

}  // namespace zeroth
