// The training config's own sections (model, data, run, parallel with DeepSpeed's pipeline), each
// read into its part of TrainConfig with its key paths in every message. Internal to
// train_config.cc, which calls them in dependency order.
#pragma once

#include <nlohmann/json.hpp>  // nlohmann::json

#include "train/config/train_config.h"  // TrainConfig

namespace zeroth {

void read_model(TrainConfig& t, const nlohmann::json& j, int default_vocab);
void read_data(TrainConfig& t, const nlohmann::json& j);
// `launched_world_size`: WORLD_SIZE when a launcher started the process, else 0.
void read_run(TrainConfig& t, const nlohmann::json& j, int launched_world_size);
// DeepSpeed's `tensorboard` and `csv_monitor`, after read_run (their default folder is its
// output_dir).
void read_monitors(TrainConfig& t, const nlohmann::json& j);
// zeroth's `parallel` section and DeepSpeed's `pipeline`; sets gradient_accumulation_steps in `j`
// from parallel.micro_batches.
void read_parallel(TrainConfig& t, nlohmann::json& j);

}  // namespace zeroth
