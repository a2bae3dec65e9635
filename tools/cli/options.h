// What several of `zeroth`'s commands share: a run's config given as a file or a run's folder with
// --set and --resume, the ranks it runs on, and a model given by a count, a preset or dimensions.
#pragma once

#include <cstdint>     // uint64_t
#include <functional>  // std::function
#include <string>      // std::string
#include <vector>      // std::vector

#include <CLI/CLI.hpp>

#include "comm/communicator.h"          // Communicator
#include "core/device.h"                // Device
#include "planner/gpt_layout.h"         // GptShape
#include "train/config/train_config.h"  // TrainConfig

namespace zeroth::tools {

// A run's config on the command line: CONFIG (a file or a run's folder), --set's overrides and
// --resume's value ("" none, "-" run.checkpoint_dir, else a checkpoint, step or run folder).
struct RunConfigArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string resume;
};
// CONFIG, --set and --resume on `cmd`. `use` says what the command does with the weights a
// checkpoint holds ("Continue from", "Evaluate", "Generate from"); `config_help` what it takes
// from CONFIG; `set_example` shows --set at work.
void add_run_config_options(CLI::App* cmd, RunConfigArgs& args, const std::string& use, const std::string& config_help,
                            const std::string& set_example);
// untangle_resume, then load_run_config.
TrainConfig load_run_config(RunConfigArgs& args, bool trained_weights = false);

// A run's config from its file, or from a run folder's config.json, with --set overrides applied
// (run.name defaults to the file's stem; a launched process's world size is the launcher's), and
// --resume's value: "" none, "-" run.checkpoint_dir, else a checkpoint, step or run folder.
// `trained_weights`: a run folder's config starts from that run's trained weights (eval, generate)
// unless --resume or --set run.init_from say otherwise.
TrainConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides, const std::string& resume = "",
                            bool trained_weights = false);
// `zeroth CMD --resume CONFIG`: the flag's optional value took the config; both back in their
// places (a JSON file given as the only argument is the config, resuming from its
// run.checkpoint_dir; a run's folder is the config and the checkpoints both).
void untangle_resume(std::string& config, std::string& resume);
// `work` on every rank of the config's world, each with its device: this process's rank when
// started by `zeroth launch` (over gloo), else run.world_size ranks as threads.
void on_every_rank(const TrainConfig& config, const std::function<void(Communicator&, Device&)>& work);

// "7.5B", "175e9", "1T", "350M", "230G": a positive count (K, M, B or G, T: powers of 1000);
// InvalidArgument naming `flag` otherwise.
double parse_count(const std::string& text, const char* flag);

// A GPT given by its dimensions: --layers, --hidden, --heads (`role` says what they stand instead
// of), --seq and --vocab into `shape`, whose seq_len and vocab should hold the defaults.
void add_gpt_shape_options(CLI::App* cmd, GptShape& shape, const std::string& role);
bool gpt_shape_given(const GptShape& shape);  // any of --layers, --hidden, --heads
// `shape`, or InvalidArgument saying what is wrong with the dimensions given.
const GptShape& checked_gpt_shape(const GptShape& shape);
// GptConfig::preset(name), or InvalidArgument naming --model and the presets.
GptConfig checked_preset(const std::string& name);
// A preset's shape (GPT-2's sizes, the Llama family's) at `seq_len`; `vocab_option` is --vocab's
// value, refused unless it is the default (a preset has its own vocabulary).
GptShape preset_shape(const std::string& name, uint64_t seq_len, uint64_t vocab_option);

}  // namespace zeroth::tools
