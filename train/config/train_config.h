// A training run's configuration: one JSON file in DeepSpeed's vocabulary (batch triple, fp16,
// bf16, optimizer, scheduler, zero_optimization, gradient_clipping, steps_per_print, aio,
// activation_checkpointing, ...) plus zeroth's own sections `model`, `data` and `run`.
//
// Everything is resolved and validated before anything is allocated: "auto" values get what the
// Hugging Face integration would give them (from the rest of the config and HF's defaults),
// unknown keys are errors with a "did you mean", wrong types and ranges name the key path and the
// allowed values, and DeepSpeed options zeroth does not implement are errors naming them and
// what they do (engine/config/deepspeed_keys.h), or, when zeroth always does what they ask, named once.
#pragma once

#include <cstddef>      // size_t
#include <cstdint>      // int64_t
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "engine/config/config.h"      // EngineConfig
#include "engine/pipeline/schedule.h"  // PipeKind
#include "models/decoder/gpt.h"        // GptConfig
#include "train/corpus/jsonl.h"        // Fields
#include "train/corpus/samples.h"      // LossOn

namespace zeroth {

enum class DataFormat : uint8_t { bin, text, synthetic, jsonl };

struct DataConfig {
  DataFormat format = DataFormat::synthetic;
  std::string train;  // bin: llm.c token file; text: any file, one token per byte (or data.tokenizer's); jsonl: a file or folder
  std::string val;    // optional; without it the last val_fraction of train is held out
  double val_fraction = 0.1;
  // A SentencePiece model (or its folder) that text is tokenized with (train/text/tokenizer.h), and its
  // vocabulary's size; "": text is bytes.
  std::string tokenizer;
  int tokenizer_vocab = 0;
  // jsonl: the records' keys, what the loss counts, a chat template file that overrides the
  // tokenizer folder's, and whether a sample longer than model.seq_len + 1 tokens is cut (else an
  // error naming it).
  corpus::Fields fields;
  corpus::LossOn loss_on = corpus::LossOn::automatic;
  std::string chat_template;
  bool truncate = true;
  bool packing = false;  // whole samples packed into rows of model.seq_len (train/corpus/packing.h)
  int vocab_size = 256;  // synthetic only
  // 0 until resolved: by default 1 Mi tokens, or enough for 8 batches of training windows beside
  // the held-out tail when a batch is larger.
  int64_t synthetic_tokens = 0;
};

struct RunConfig {
  std::string name = "run";
  int64_t steps = 100;        // optimizer steps
  int64_t eval_interval = 0;  // validation every this many steps (0: at the end only)
  // Micro-batches per rank per validation (0, "all" in the config: every window). A validation
  // measures the first eval_batches x micro-batch x data-parallel windows of the validation data,
  // as `zeroth eval --windows` that many does.
  int64_t eval_batches = 4;
  uint64_t seed = 1234;
  std::string output_dir;  // metrics.jsonl and config.json; "" = runs/<name>
  std::string device = "cpu";
  size_t device_memory = 0;       // bytes of the device (the accelerator); 0: unlimited on the CPU
  size_t host_memory = 0;         // bytes of host memory the engine may hold state in; 0: unlimited
  int world_size = 1;             // ranks in all: data-parallel x pipeline stages x tensor-parallel
  std::string backend = "local";  // local (threads) | gloo (processes) | nccl (GPUs)
  std::string progress = "auto";  // auto (a bar on a terminal) | bar | lines
  // Steps in a row whose gradients are non-finite (with fp16: at the smallest loss scale) after
  // which the run ends with an error; 0: never.
  int64_t max_nonfinite_steps = 10;
  // Checkpoints (engine/checkpoint/checkpoint.h): every this many steps (0: only at the end, where a run
  // always saves one; -1: none at all), into this folder ("" = <output_dir>/checkpoints), keeping the newest keep_last
  // step folders (0: all).
  int64_t checkpoint_interval = 0;
  std::string checkpoint_dir;
  int64_t keep_last = 0;
  // Each rank copies its part to host memory and a thread writes it while training goes on; the
  // checkpoint is published after the next step (ckpt::Saver).
  bool checkpoint_async = false;
  // Initial weights instead of the seeded initialization: a GPT-2 safetensors file in Hugging Face's
  // names (a published GPT-2, or a run's model.safetensors) or a zeroth checkpoint (its weights;
  // the optimizer state starts fresh, at step 0). Ignored when resuming.
  std::string init_from;
  // Per-rank timelines of the last step as a Chrome trace (<output_dir>/trace.json), and the
  // measured pipeline bubble each step (pipelines only).
  bool trace = false;
  // Tokens of text sampled from the trained weights at the end (text data, or data.tokenizer's):
  // zeroth generate at temperature 0.8, top-k 40, seeded by run.seed. 0: none.
  int sample_tokens = 64;
  // Not a config key: `zeroth train --resume [DIR]`: a checkpoint folder or step folder to continue
  // from ("" = start fresh).
  std::string resume;
};

// One of DeepSpeed's file monitors (`tensorboard`, `csv_monitor`): written by rank 0 into
// <output_path>/<job_name>; an empty output_path means run.output_dir (DeepSpeed's is the
// working directory).
struct MonitorSection {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
  std::string dir() const { return output_path + "/" + job_name; }  // with output_path resolved
};

struct MonitorConfig {
  MonitorSection tensorboard, csv;
};

// The process grid beyond data parallelism: `parallel` (zeroth's keys) and DeepSpeed's `pipeline`.
struct ParallelConfig {
  int tensor = 1;                  // tensor-parallel ranks (Megatron-LM's split of each layer), the fastest grid axis
  bool sequence_parallel = false;  // with tensor > 1: the residual stream and LayerNorms split by tokens too
  int pipeline = 1;                // stages
  // Expert parallelism: each expert layer's experts shared out over runs of this many
  // data-parallel ranks (GptPart::ep_ranks); divides the data-parallel size.
  int expert = 1;
  // The expert layers' all-to-alls on a stream of their own, under the experts' products.
  bool expert_overlap = true;
  // Ulysses sequence parallelism (DeepSpeed's sequence_parallel_size): runs of this many consecutive
  // data-parallel ranks share each sample, each holding model.seq_len / sequence of its positions
  // (GptPart::sq_ranks); ZeRO still shards over every data-parallel rank. Divides the data-parallel
  // size and model.seq_len.
  int sequence = 1;
  // Ring attention (context parallelism, models/decoder/context_ring.h): runs of this many
  // consecutive data-parallel ranks share each sample, each holding two of its 2 context chunks of
  // positions (GptPart::cp_ranks). Divides the data-parallel size; 2 context divides model.seq_len.
  int context = 1;
  PipeKind schedule = PipeKind::one_f_one_b;
  int virtual_stages = 1;                // model chunks per stage (interleaved)
  std::string partition = "parameters";  // parameters | uniform (partition_counts when a list was given)
  std::vector<int> partition_counts;     // layers per virtual stage
};

struct TrainConfig {
  EngineConfig engine;
  ParallelConfig parallel;
  GptConfig model;
  std::string model_preset;  // "" when the shape was given key by key
  // lora.init_from: a PEFT adapter folder (adapter_config.json, adapter_model.safetensors) the
  // adapters start from instead of PEFT's initialization ("" when none).
  std::string lora_init_from;
  DataConfig data;
  RunConfig run;
  MonitorConfig monitors;
  int64_t train_batch_size = 0;
  int64_t micro_batch_size = 0;  // sequences per rank per micro-step
  int64_t steps_per_print = 10;
  nlohmann::json resolved;  // the config with every default and "auto" filled in
  // scheduler.params.total_num_steps was "auto" (run.steps), not a number the config gave.
  bool schedule_steps_auto = false;
  // DeepSpeed keys present that change nothing in zeroth ("path: why"; engine/config/deepspeed_keys.h).
  std::vector<std::string> no_effect;

  // `launched_world_size` > 0 when the process was started by a launcher (its WORLD_SIZE); the
  // config's run.world_size must then agree (or be "auto"). ConfigError on any problem.
  static TrainConfig from_json(const nlohmann::json& config, int launched_world_size = 0);
  int64_t tokens_per_step() const { return train_batch_size * model.seq_len; }
  // The ranks ZeRO shards over: every rank of a pipeline stage's tensor-parallel place.
  int data_parallel() const { return run.world_size / (parallel.pipeline * parallel.tensor); }
  // The ranks that read different samples: the data-parallel ranks over the Ulysses groups. The batch
  // sizes count these (DeepSpeed's data-parallel size under sequence parallelism).
  int sample_parallel() const { return data_parallel() / sample_ranks(); }
  // The ranks that share each sample: Ulysses' or the ring's group.
  int sample_ranks() const { return parallel.sequence * parallel.context; }
  // Layers per virtual stage (pipelines) and the part of the model of the rank at pipeline stage
  // `stage` and tensor-parallel rank `tp_rank`.
  std::vector<int> layers_per_virtual_stage() const;
  GptPart part(int stage, int tp_rank = 0, int dp_rank = 0) const;
};

// Reads and parses a config file: IoError if it cannot be read, ConfigError (with line and
// column) if it is not JSON.
nlohmann::json read_config_file(const std::string& path);
// Applies "key.path=value" (value parsed as JSON, else taken as a string), creating objects on
// the way. ConfigError when the assignment is malformed or crosses a non-object.
void apply_override(nlohmann::json& config, std::string_view assignment);

// Started again by `zeroth launch --max-restarts` (ZEROTH_RESTART_COUNT above 0) and not told
// where to resume: on from the latest checkpoint this job published (since ZEROTH_JOB_STARTED),
// from the start where it published none, never from an earlier run's in the same folder.
void resume_after_restart(RunConfig& run);
// A resume whose config leaves scheduler.params.total_num_steps to "auto" while run.steps differs
// from the checkpoint's run: the checkpoint's total, which the caller keeps (with a warning) so the
// learning rate goes on along the schedule the run started on; nullopt otherwise.
std::optional<int64_t> saved_schedule_steps(const TrainConfig& config);

}  // namespace zeroth
