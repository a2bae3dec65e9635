// `zeroth estimate`'s options and its modes without a config (internal to tools/cli): a parameter
// count (the ZeRO paper's model states, or DeepSpeed's own tables), a preset, or a GPT's shape with
// its layout over the GPUs.
#pragma once

#include <algorithm>  // std::any_of
#include <cstdint>    // uint64_t
#include <string>     // std::string
#include <vector>     // std::vector

#include <CLI/CLI.hpp>  // CLI::Option

#include "planner/gpt_layout.h"  // GptShape

namespace zeroth::tools {

struct EstimateOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string device_memory, host_memory;  // "" = the config's
  bool json = false;
  // Parameter-count mode (instead of a config): the ZeRO paper's model states per GPU; `model`: a
  // preset's exact count and largest block instead of --params.
  std::string params, largest_layer, model;
  int gpus_per_node = 1, nodes = 1;
  bool deepspeed_compatible = false;  // DeepSpeed's own two tables, with its numbers
  // GPT-dimension mode: the model's shape and its layout over the GPUs.
  GptShape shape{0, 0, 0, 2048, 51200};
  uint64_t micro_batch = 1, micro_batches = 1, tp = 1, pp = 1;
  uint64_t sequence = 1;  // Ulysses ranks per sample (of the data-parallel ranks)
  uint64_t context = 1;   // ring attention's ranks per sample, alike
  bool sequence_parallel = false, gpipe = false, tiled_mlp = false, host_checkpoints = false;
  std::string runtime_memory;
  // --seq, --micro-batch(es), --tp, --pp, ...: with --model, any of them given asks for the
  // preset's layout table (activations too) instead of its model states alone.
  std::vector<const CLI::Option*> layout_options;
  bool layout_given() const {
    return std::any_of(layout_options.begin(), layout_options.end(), [](const CLI::Option* opt) { return opt->count() > 0; });
  }
};

// --params or --model (its count): stage x placement per GPU.
int estimate_params(const EstimateOptions& o);
// --layers/--hidden/--heads, or --model with layout options: the layout's memory per GPU.
int estimate_shape(const EstimateOptions& o, const GptShape& shape);

}  // namespace zeroth::tools
