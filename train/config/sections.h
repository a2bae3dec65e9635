// The training config's sections, one file each group, read into their parts of TrainConfig with
// their key paths in every message. Internal to train/config: train_config.cc calls them in
// dependency order, each under the read's ConfigErrors (core/config_section.h).
//   model.cc     model: GPT-2, the Llama family, mixture of experts; presets; a Hugging Face config.json
//   run.cc       data, run, and DeepSpeed's monitors (tensorboard, csv_monitor)
//   parallel.cc  parallel, and DeepSpeed's pipeline
//   batch.cc     DeepSpeed's batch triple and "auto" values, bf16/fp16, communication_data_type
#pragma once

#include <nlohmann/json.hpp>  // nlohmann::json

#include "train/config/train_config.h"  // TrainConfig

namespace zeroth {

void read_model(TrainConfig& t, const nlohmann::json& j, int default_vocab);
// The `lora` section (PEFT's LoraConfig keys), after read_model.
void read_lora(TrainConfig& t, const nlohmann::json& j);
// The tokenizer's and the data's token ids against the model's embedding rows.
void check_vocabulary(const TrainConfig& t);
void read_data(TrainConfig& t, const nlohmann::json& j);
// `launched_world_size`: WORLD_SIZE when a launcher started the process, else 0.
void read_run(TrainConfig& t, const nlohmann::json& j, int launched_world_size);
// DeepSpeed's `tensorboard` and `csv_monitor`, after read_run (their default folder is its
// output_dir).
void read_monitors(TrainConfig& t, const nlohmann::json& j);
// zeroth's `parallel` section and DeepSpeed's `pipeline`; sets gradient_accumulation_steps in `j`
// from parallel.micro_batches.
void read_parallel(TrainConfig& t, nlohmann::json& j);
// After read_parallel: DeepSpeed's "auto" values (Hugging Face's rules) filled in `c`, the batch
// triple checked against the data-parallel size, the default synthetic data sized to the batch.
void read_batch(TrainConfig& t, nlohmann::json& c);
// bf16 / fp16 and communication_data_type.
void read_precision(TrainConfig& t, const nlohmann::json& j);
// The resolved config's "auto" values that only meant a default, removed (DeepSpeed's own).
void drop_default_autos(nlohmann::json& c);

}  // namespace zeroth
