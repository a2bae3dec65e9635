// One training run on one rank (train/trainer.cc's loop, train/training_run.cc's steps): internal
// to train/.
#pragma once

#include <atomic>      // std::atomic
#include <chrono>      // std::chrono::steady_clock
#include <exception>   // std::exception_ptr
#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <optional>    // std::optional
#include <string>      // std::string
#include <utility>     // std::pair
#include <vector>      // std::vector

#include <fmt/format.h>  // fmt::format

#include "core/error.h"                    // OutOfMemory
#include "engine/checkpoint/checkpoint.h"  // ckpt::Saver
#include "engine/engine.h"                 // Engine
#include "engine/pipeline/runner.h"        // PipelineRunner
#include "models/decoder/gpt.h"            // Gpt
#include "train/data.h"                    // RunData
#include "train/trainer.h"

namespace zeroth {

// A device or host allocation past its budget names the part of the run it came from: the
// budgets were checked against the plan's estimate at start, so this says what it did not count.
template <typename Fn>
auto in_phase(const std::string& phase, Fn&& fn) {
  try {
    return fn();
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(fmt::format("{}: {}", phase, e.what()));
  }
}

// One training run on this rank, as named steps: restore (resume or init_from), evaluate, one
// step (the cycle's passes, the engine's step, the agreement on loss and stop, the report),
// save, and finish (weights, summary). train() reads top to bottom; what the steps share lives
// here, declared in the order it must be made: the tokens and losses before the model (its queued
// work reads and writes them until its destructor has waited for it, also when a step fails), the
// runner before the model too, but destroyed first (RunnerFirst), the saver after the engine it
// saves.
class TrainingRun {
 public:
  TrainingRun(const TrainConfig& config, Communicator& world, Device& device, TrainObserver* observer, const std::atomic<bool>* stop);
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  // The engine's memory (checked against the budgets first); resumed: the engine's state,
  // counters and the loop's own from the checkpoint, before anything of the output folder is
  // replaced; else the weights of run.init_from, when given.
  // `for_eval`: the weights only matter (a checkpoint at or past run.steps is fine, earlier
  // checkpoints in the folder are not this run's business).
  void restore(bool for_eval = false);
  // The run's facts to the observer, and the buffer agree() reduces through.
  void start();
  bool resumed() const { return !summary_.resumed_from.empty(); }
  int64_t first_step() const { return summary_.start_step; }
  // The run's validation after `step` steps: the first run.eval_batches x micro-batch x
  // data-parallel windows, as `zeroth eval --windows` that many measures them.
  void evaluate(int64_t step);
  // The first `most` complete windows of the validation data (0: all), shared out over the
  // data-parallel ranks.
  EvalResult evaluate_windows(int64_t most);
  // The forward of `rows` sequences in tokens_/targets_ into losses_[0], through the pipeline
  // when there is one; synchronized.
  void evaluate_rows(int rows);
  // Step k + 1; false when the ranks agreed to stop.
  bool step(int64_t k);
  // The asynchronous save still in flight, the weights, the summary.
  TrainSummary finish();

 private:
  // The world the launcher started must be the config's: before anything is split from it.
  static int checked_rank(const TrainConfig& config, Communicator& world);
  // Rank 0's observer writes the run's files; a failure there (disk full, read-only) is kept and
  // every rank stops at the next agreement, so no rank waits in a collective for rank 0.
  template <typename Fn>
  void report(Fn&& fn) {
    if (!lead_ || observer_ == nullptr || report_error_) return;
    try {
      fn();
    } catch (...) {
      report_error_ = std::current_exception();
    }
  }
  Engine& configured_engine();
  PipeModel make_stage_model();
  // Mean of the loss over the data-parallel ranks of the stage that computes it (its
  // tensor-parallel ranks all hold the same), and whether any rank asked to stop, on the compute
  // stream over the world: the engine's own collectives travel on communicators split from dp.
  std::pair<double, bool> agree(double value, bool stop_here);
  // The expert layers' figures of this step over every rank (into s; nothing without experts).
  void agree_moe(StepMetrics& s);
  // The cycle's forward and backward passes of step k; their times with wall_clock_breakdown.
  void run_passes(int64_t k, double pass_seconds[2]);
  // Step k's loss divisor (Gpt::set_loss_divisor): its global batch's counted targets per micro-batch.
  void set_loss_divisor(int64_t k);
  // The positions of step k's rows: model.seq_len, or for JSON Lines samples without a pipeline the
  // longest row of its global batch, rounded up (the rest of every row is padding).
  int cycle_width(int64_t k);
  // Micro-batch m's rows, filled model.seq_len apart, cut to `width` positions each.
  void cut_rows(int m, int width);
  // A pipeline stage's stamps of the step: its bubble, and its passes' times.
  void take_measure(int64_t k, double pass_seconds[2]);
  void report_step(int64_t k, double loss, double seconds, const StepResult& r, const double pass_seconds[2]);
  // Steps whose gradients held Inf or NaN with no scale left to lower end the run at
  // run.max_nonfinite_steps in a row.
  void count_nonfinite(int64_t k, const StepResult& r);
  // What a checkpoint keeps of the loop: the data position (a function of the step, see
  // train/data.h) and the non-finite streak. An asynchronous save is published after the next
  // step, or before the run ends.
  void save(int64_t step);
  // LoRA: the adapters in PEFT's files in run.output_dir (hf/export.h, save_lora_adapter).
  void save_adapter();
  void published(const ckpt::IoStats& io);

  const TrainConfig& config_;
  Communicator& world_;
  Device& device_;
  TrainObserver* observer_;
  const std::atomic<bool>* stop_;
  const bool lead_;
  // Pipelines and tensor parallelism: ranks are laid out as ProcessGrid(dp, pp, tp) and ZeRO
  // partitions over the data-parallel group of each (stage, tensor-parallel rank); without either
  // the world is the data-parallel group.
  const int pp_, tp_;
  std::optional<ProcessGrid::Groups> groups_;
  Communicator& dp_;
  // The expert-parallel group: runs of parallel.expert consecutive data-parallel ranks; the Ulysses
  // group alike, runs of parallel.sequence (null: none).
  std::unique_ptr<Communicator> experts_, sequence_;
  const int stage_, tp_rank_;
  const GptPart part_;
  std::unique_ptr<PipelineRunner> runner_;
  const bool heads_;  // this stage computes the loss
  const int mb_, T_, gas_;
  // Ulysses or the ring: the group's size and this rank's place; each micro-batch's rows are read
  // whole and keep_positions leaves this rank's T_ / U_ positions of each (the positions stay whole).
  const int U_, sq_rank_;
  const size_t n_;  // tokens of a micro-batch, whole rows
  RunData run_data_;
  // Planned once. The engine holds the whole need per rank (its plan, the model's activations
  // and scratch) against the budgets before anything is allocated.
  StagePlan planned_;
  TrainSummary summary_;
  std::vector<int32_t> tokens_, targets_;
  std::vector<int32_t> positions_;  // packed data only (data.packing)
  // Micro-batch m's positions, or null when each row is one sequence.
  int32_t* positions(int m) { return positions_.empty() ? nullptr : positions_.data() + m * n_; }
  std::vector<float> losses_;
  Engine engine_;
  Gpt gpt_;
  // Destroyed before the model: the runner's channels move data in its buffers. A member, so it
  // holds when the constructor fails after this point too.
  struct RunnerFirst {
    std::unique_ptr<PipelineRunner>& runner;
    ~RunnerFirst() { runner.reset(); }
  } runner_first_{runner_};
  std::exception_ptr report_error_;
  int64_t nonfinite_ = 0, last_finite_step_ = 0;
  double last_finite_loss_ = 0;
  Buffer shared_, moe_shared_;
  int eval_rows_ = 0;  // rows of the evaluation's micro-batch (mb_, or fewer for the last windows)
  PipeModel stage_model_;
  ckpt::Saver saver_;
  int64_t saved_step_ = 0;
  std::vector<double> rates_, bubbles_;
  PipeMeasure last_trace_;
  double tokens_per_step_;     // the positions a step runs (its rows' width x the global batch)
  int row_width_ = 0;          // the last step's (cycle_width)
  int attention_context_ = 0;  // the last step's packed samples' (StepMetrics::attention_context), 0 unpacked
  // Micro-batch m's tokens and targets, rows of `width` positions, moved to this rank's width / U_ of
  // each row, packed from the start (a no-op without Ulysses).
  void keep_positions(int m, int width);
};

}  // namespace zeroth
