// A run's folder (what `zeroth train` writes into run.output_dir: config.json, the resolved config;
// metrics.jsonl; model.safetensors; checkpoints/) where a command takes a config, initial weights
// or a checkpoint: `zeroth eval RUN_DIR`, `run.init_from=RUN_DIR`, `--resume RUN_DIR`.
#pragma once

#include <string>  // std::string

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

namespace zeroth {

// A folder holding metrics.jsonl and a config.json with zeroth's `run` section (a Hugging Face
// model folder's config.json has none).
bool is_run_folder(const std::string& path);
// The run's config file: RUN_DIR/config.json.
std::string run_folder_config(const std::string& run_dir);
// The run's trained weights: its model.safetensors, else (a run that stopped before writing them)
// its checkpoints. ConfigError naming what the folder lacks.
std::string run_folder_weights(const std::string& run_dir);
// The run's checkpoint folder: RUN_DIR/checkpoints, else the run.checkpoint_dir its config names,
// whichever holds a published checkpoint. ConfigError naming both when neither does.
std::string run_folder_checkpoints(const std::string& run_dir);
// Refuses (InvalidArgument) an export's folder `out` that holds a zeroth checkpoint or a training
// run: its config.json and model.safetensors are what the folder is.
void refuse_export_into(const std::string& out);
// What --resume DIR names: a run folder's checkpoints, else DIR as given.
std::string resume_path(const std::string& dir);

// The files a config names (data.train, data.val, data.tokenizer, data.chat_template,
// model.hf_config, run.init_from)
// as absolute paths, so the run's config.json names them from any folder: a relative one from the
// working folder where it is there, else from the config file's folder (`config_path`). One found
// in neither is left as given, for the error that names it.
void resolve_config_paths(nlohmann::json& config, const std::string& config_path);

}  // namespace zeroth
