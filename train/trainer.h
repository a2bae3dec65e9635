// The training loop of `zeroth train`: one rank's run of a TrainConfig on a device and a
// data-parallel communicator. The GPT, the engine and the loader are built here; what is shown to
// the user (config box, progress, metrics files) is the observer's business, called on rank 0.
#pragma once

#include <array>     // std::array
#include <atomic>    // std::atomic
#include <cstdint>   // int64_t
#include <optional>  // std::optional

#include <nlohmann/json.hpp>  // nlohmann::json

#include "comm/communicator.h"             // Communicator
#include "core/device.h"                   // Device
#include "core/memory.h"                   // kMemTagCount
#include "engine/checkpoint/checkpoint.h"  // ckpt::IoStats
#include "engine/engine.h"                 // Engine
#include "engine/plan/estimate.h"          // MemoryNeed
#include "engine/plan/plan.h"              // Plan
#include "train/config/train_config.h"     // TrainConfig
#include "train/corpus/samples.h"          // SampleStats

namespace zeroth {

struct StepMetrics {
  int64_t step = 0;  // 1-based optimizer step
  double loss = 0;   // mean over the global batch
  double lr = 0;
  double grad_norm = 0;
  double loss_scale = 1;
  bool skipped = false;  // overflow: no update
  double step_seconds = 0;
  double tokens_per_second = 0;
  int row_width = 0;  // positions per row this step (JSON Lines rows cut to their step's longest); 0: model.seq_len
  // The positions a token attends over, for the model FLOPs' attention term: the row's, or with
  // packed samples each sample's length weighted by its tokens (sum n^2 / sum n); 0: row_width.
  int attention_context = 0;
  size_t peak_bytes = 0;  // this rank's device, all tags
  // wall_clock_breakdown: rank 0's forward and backward passes (synchronized), the wait for the
  // reductions after the last backward, and the rest of the optimizer step.
  double forward_seconds = 0, backward_seconds = 0, reduce_wait_seconds = 0, optimizer_seconds = 0;
  // Ulysses (parallel.sequence): this rank's all-to-alls' time on the compute stream, within the
  // forward and backward passes (with wall_clock_breakdown; -1 without Ulysses or the ring). With
  // ring attention (parallel.context, sequence_ring), the time the compute stream waited for the
  // ring's sends (which run on a stream of their own): their exposed share.
  double sequence_exchange_seconds = -1;
  bool sequence_ring = false;
  // wall_clock_breakdown with swap files: rank 0's bytes read and written, and its streams' time
  // waiting on them (summed over streams).
  uint64_t swap_read_bytes = 0, swap_write_bytes = 0;
  double swap_busy_seconds = 0;
  // The optimizer's part (in optimizer_seconds, or in the backward pass for sub-groups updated there).
  uint64_t optimizer_swap_read_bytes = 0, optimizer_swap_write_bytes = 0;
  // Sub-groups updated during the backward pass (offload_optimizer.overlap_backward): kept, redone
  // (the step clipped) or undone (skipped); none when no update ran there.
  Speculation speculation = Speculation::none;
  // offload_optimizer.delayed_update: the step's update runs under the next step (its
  // optimizer_seconds is then the wait for the update before it, and the launch).
  bool update_delayed = false;
  // Expert layers (model.moe), over every rank's layers and micro-batches: the mean load-balancing
  // and z losses per layer pass (without their coefficients), the fraction of choices dropped past
  // the capacity, and the busiest expert's rows over the mean (the largest of any layer pass).
  bool moe = false;
  double moe_aux_loss = 0, moe_z_loss = 0, moe_dropped = 0, moe_max_load = 0;
};

struct TrainSummary {
  int64_t steps = 0;             // optimizer steps run
  bool interrupted = false;      // stopped early on request (Ctrl-C)
  double seconds = 0;            // wall time of the steps (validation excluded)
  double tokens_per_second = 0;  // median over the steps after the first
  double first_loss = 0, last_loss = 0;
  double first_val_loss = -1, last_val_loss = -1;  // -1: no validation ran
  int64_t first_val_step = 0, last_val_step = 0;   // the steps after which they ran
  size_t parameters = 0;
  std::array<size_t, kMemTagCount> peak{};  // this rank's device, per tag
  size_t peak_total = 0;
  size_t host_peak = 0;             // this rank's engine state in host memory (pinned and pageable), at peak
  size_t swap_bytes = 0;            // this rank's swap files on the NVMe tier
  size_t swap_disk_bytes = 0;       // what the file system allocated to them (st_blocks), rank 0
  size_t peak_rss = 0;              // the process's peak resident set (VmHWM; all ranks of a threaded run)
  size_t peak_rss_before_save = 0;  // the same before the end-of-run weights file (after the last checkpoint)
  // The trained weights in Hugging Face's GPT-2 layout (<run.output_dir>/model.safetensors), their
  // dtype and size (rank 0).
  std::string weights_path;
  DType weights_dtype = DType::f32;
  uint64_t weights_bytes = 0;
  double weights_seconds = 0;  // gathering and writing them
  // Checkpoints: where the run started from ("" = fresh) and the last one it saved (this rank's
  // timing; bytes of all ranks' files).
  std::string resumed_from;
  int64_t start_step = 0;  // steps done before this run (from the checkpoint)
  ckpt::IoStats resume_io, last_save;
  int checkpoints_saved = 0;
  // Pipelines: the measured bubble (median over the steps after the first: 1 - busy / makespan
  // over the stages) next to the formula, each stage's peak of activation memory, and the Chrome
  // trace of the last step (run.trace).
  double pipeline_bubble = 0, bubble_formula = 0;
  std::vector<size_t> stage_activation_peak;
  nlohmann::json trace;  // rank 0's, with run.trace: what the observer writes to <output_dir>/trace.json
  // Tensor parallelism: what rank 0's model moved in its tensor-parallel group (its collectives'
  // logical bytes, CommStats), training and evaluation passes together.
  CommStats tensor_traffic;
};

// What the run found out at start, for the config box.
struct RunFacts {
  size_t parameters = 0;
  size_t train_tokens = 0, val_tokens = 0;
  int64_t train_rows = 0, val_rows = 0;  // windows or samples
  MemoryNeed need;                       // per rank: the engine's plan, the model's activations and scratch
  // JSON Lines data: the training samples' tokens and counted targets, and what reading them
  // skipped or cut.
  std::optional<corpus::SampleStats> samples;
  double packing_fill = 0;  // data.packing: the share of the training rows' positions samples fill
};

// A validation's mean next-token cross-entropy over rows [0, windows) of the validation data (a
// token stream's window i: inputs tokens [i T, i T + T), as targets the token after each; T =
// model.seq_len; JSON Lines: sample i, its targets that count), of the `of` rows it holds.
struct EvalResult {
  double loss = 0;
  int64_t tokens = 0, windows = 0, of = 0;  // tokens: the targets the mean is over
  const char* rows = "windows";             // what windows and of count: "windows" or "samples"
  double seconds = 0;
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_start(const TrainConfig&, const Plan&, const RunFacts&) {}
  virtual void on_step(const StepMetrics&) {}
  virtual void on_eval(int64_t /*step*/, const EvalResult&) {}
  virtual void on_resume(const ckpt::IoStats&, int64_t /*step*/) {}
  virtual void on_checkpoint(const ckpt::IoStats&, int64_t /*step*/) {}
  virtual void on_end(const TrainSummary&) {}
};

// Runs the config's steps on this rank (collective over `world`: data-parallel x pipeline ranks). `observer` is called on rank 0
// only; `stop` (any rank) ends the run cleanly after the current step on every rank.
// What rank `dp_rank` of pipeline stage `stage` plans (stage 0 without a pipeline): the engine's
// plan for its part of the model in its schedule's pass order (the tied embedding marked on the
// first and last stage), the model's footprint, and the estimate of both. What train() runs with,
// and what --dry-run and `zeroth estimate --config` report.
struct StagePlan {
  Plan plan;
  ModelFootprint model;
  MemoryNeed need;
};
StagePlan plan_stage(const TrainConfig& config, int stage, int dp_rank, int tp_rank = 0);
// The stage whose ranks need the most device memory, and that plan.
StagePlan largest_stage(const TrainConfig& config, int* stage = nullptr);

// Pageable host memory a rank's threads hold outside every buffer zeroth allocates: their stacks
// and the part of the allocator arenas they fill that is not the device's small blocks. Measured
// once from /proc/self/smaps of the 4-rank tiny GPT (configs/gpt-fortunes-zero3-bf16.json): each
// rank thread's malloc arena held 2.9 MiB of which 1.2 MiB were small device blocks, and each
// rank has about three threads whose stacks hold 200-212 KiB each: 2.4 MiB per rank.
inline constexpr size_t kRankThreadsHostBytes = size_t{5} << 19;  // 2.5 MiB
// MemoryNeed::run_host for a rank of this config: its data (run_data_host_bytes, when `count_data`),
// its threads' and its products' (cpu::gemm_host_bytes). IoError / ConfigError when the data cannot be opened.
size_t run_host_bytes(const TrainConfig& config, bool count_data = true);

// Opens the config's data and checks it against the batch (what train() does first), for
// --dry-run. ConfigError / IoError as train() would give.
void check_data(const TrainConfig& config);

// run.init_from into a finalized engine: a zeroth checkpoint's weights, or Hugging Face weights (a
// .safetensors file or a model folder), of which each rank reads only what it holds: its pipeline
// stage's blocks, its tensor-parallel slices, and with ZeRO-3 its share of each block.
void load_initial_weights(Engine& engine, const TrainConfig& config);
// lora.init_from: the adapters of a PEFT adapter folder (adapter_config.json with the config's r
// and alpha, adapter_model.safetensors holding every adapter under PEFT's names) into the engine's
// adapter blocks. ConfigError naming the folder and what does not match.
void load_lora_adapter(Engine& engine, const TrainConfig& config);

// `zeroth eval`: the mean next-token cross-entropy of the weights the config starts from
// (run.init_from, run.resume's checkpoint, or else its fresh initialization) over the first
// `windows` complete windows of the validation data (all of them with 0, or when there are fewer).
// Collective over `world`, any layout of it; every rank returns the same result.
EvalResult evaluate(const TrainConfig& config, Communicator& world, Device& device, int64_t windows = 0);

TrainSummary train(const TrainConfig& config, Communicator& world, Device& device, TrainObserver* observer,
                   const std::atomic<bool>* stop = nullptr);

}  // namespace zeroth
