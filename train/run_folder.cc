// Run folders as the arguments of eval, generate, train --resume and run.init_from.
#include "train/run_folder.h"

#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream
#include <utility>     // std::pair

#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"                // ZEROTH_THROW
#include "engine/checkpoint/format.h"  // ckpt::kLatestName, ckpt::kManifestName

namespace zeroth {
namespace {

namespace fs = std::filesystem;

bool has_checkpoint(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / ckpt::kLatestName, ec);
}

}  // namespace

bool is_run_folder(const std::string& path) {
  std::error_code ec;
  const fs::path dir(path);
  if (!fs::is_directory(dir, ec) || !fs::is_regular_file(dir / "metrics.jsonl", ec)) return false;
  std::ifstream in(dir / "config.json");
  if (!in) return false;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("run") && j["run"].is_object();
}

void refuse_export_into(const std::string& out) {
  for (const char* mark : {ckpt::kManifestName, ckpt::kLatestName}) {
    if (fs::exists(fs::path(out) / mark))
      ZEROTH_THROW(InvalidArgument, "{} holds a zeroth checkpoint ({}); export the weights into another folder", out, mark);
  }
  if (is_run_folder(out))
    ZEROTH_THROW(InvalidArgument,
                 "{} is a training run's folder (its config.json and model.safetensors are the run's); export the weights into "
                 "another folder",
                 out);
}

std::string run_folder_config(const std::string& run_dir) { return (fs::path(run_dir) / "config.json").string(); }

std::string run_folder_weights(const std::string& run_dir) {
  std::error_code ec;
  const fs::path weights = fs::path(run_dir) / "model.safetensors";
  if (fs::is_regular_file(weights, ec)) return weights.string();
  const fs::path checkpoints = fs::path(run_dir) / "checkpoints";
  if (has_checkpoint(checkpoints)) return checkpoints.string();
  ZEROTH_THROW(ConfigError,
               "{} is a run folder without its trained weights: no model.safetensors (a run writes it at its end) and no checkpoint "
               "in {}; name a weights file or a checkpoint folder instead",
               run_dir, checkpoints.string());
}

std::string run_folder_checkpoints(const std::string& run_dir) {
  const fs::path inside = fs::path(run_dir) / "checkpoints";
  if (has_checkpoint(inside)) return inside.string();
  std::ifstream in(run_folder_config(run_dir));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::string named;
  if (j.is_object() && j.contains("run") && j["run"].is_object() && j["run"].value("checkpoint_dir", nlohmann::json()).is_string())
    named = j["run"]["checkpoint_dir"].get<std::string>();
  if (!named.empty() && has_checkpoint(named)) return named;
  ZEROTH_THROW(
      ConfigError,
      "{} is a run folder, but no checkpoint of it was found: neither {} nor its run.checkpoint_dir ({}) holds a \"{}\" file; "
      "the run saved none (run.checkpoint_interval -1) or they were moved: name the checkpoint folder",
      run_dir, inside.string(), named.empty() ? "not in its config.json" : named, ckpt::kLatestName);
}

void resolve_config_paths(nlohmann::json& config, const std::string& config_path) {
  const fs::path base = fs::path(config_path).parent_path();
  for (const auto& [section, key] : {std::pair{"data", "train"},
                                     {"data", "val"},
                                     {"data", "tokenizer"},
                                     {"data", "chat_template"},
                                     {"model", "hf_config"},
                                     {"run", "init_from"}}) {
    if (!config.contains(section) || !config[section].is_object() || !config[section].contains(key)) continue;
    nlohmann::json& v = config[section][key];
    if (!v.is_string() || v.get<std::string>().empty()) continue;
    const fs::path given(v.get<std::string>());
    std::error_code ec;
    if (given.is_absolute()) continue;
    if (fs::exists(given, ec)) v = fs::absolute(given, ec).lexically_normal().string();
    else if (fs::exists(base / given, ec)) v = fs::absolute(base / given, ec).lexically_normal().string();
  }
}

std::string resume_path(const std::string& dir) {
  if (has_checkpoint(dir) || !is_run_folder(dir)) return dir;
  return run_folder_checkpoints(dir);
}

}  // namespace zeroth
