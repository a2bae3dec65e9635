// What several commands share (tools/cli/options.h).
#include "tools/cli/options.h"

#include <cstdlib>     // std::getenv
#include <filesystem>  // std::filesystem
#include <string>      // std::string
#include <utility>     // std::move

#include <CLI/CLI.hpp>        // CLI::App
#include <fmt/format.h>       // fmt::format
#include <fmt/ranges.h>       // fmt::join
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"             // ZEROTH_THROW
#include "comm/gloo/gloo_comm.h"    // make_gloo_communicator
#include "comm/local/local_comm.h"  // run_local_ranks
#include "comm/rendezvous.h"        // rendezvous_from_env
#include "core/cpu/threads.h"       // share_cores
#include "core/env.h"               // env::kLogLevel
#include "core/log.h"               // log::set_level
#include "train/run_folder.h"       // is_run_folder, resume_path

namespace zeroth::tools {

TrainConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides, const std::string& resume,
                            bool trained_weights) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec) && !is_run_folder(path)) {
    ZEROTH_THROW(ConfigError,
                 "{} is a folder, not a config file: give a JSON config, or the folder of a run zeroth train wrote (it holds "
                 "config.json and metrics.jsonl)",
                 path);
  }
  const bool run_dir = is_run_folder(path);
  nlohmann::json j = read_config_file(run_dir ? run_folder_config(path) : path);
  if (!j.is_object()) ZEROTH_THROW(ConfigError, "{}: a training config must be a JSON object", path);
  if (!j.contains("run") || !j["run"].contains("name")) j["run"]["name"] = std::filesystem::path(path).stem().string();
  bool init_given = false;
  for (const auto& s : overrides) {
    apply_override(j, s);
    init_given = init_given || s.starts_with("run.init_from=");
  }
  resolve_config_paths(j, run_dir ? run_folder_config(path) : path);
  const auto launched = rendezvous_from_env();
  TrainConfig c = TrainConfig::from_json(j, launched ? launched->world_size : 0);
  if (!resume.empty()) c.run.resume = resume == "-" ? c.run.checkpoint_dir : resume_path(resume);
  else if (run_dir && trained_weights && !init_given) c.run.init_from = run_folder_weights(path);
  return c;
}

void untangle_resume(std::string& config, std::string& resume) {
  std::error_code ec;
  if (config.empty() && !resume.empty() && resume != "-") {
    // A run's folder is its config and its checkpoints at once; a file, the config alone.
    if (is_run_folder(resume)) {
      config = resume;
    } else if (std::filesystem::is_regular_file(resume, ec)) {
      config = std::move(resume);
      resume = "-";
    }
  }
  if (config.empty()) ZEROTH_THROW(ConfigError, "a config is required: zeroth CMD CONFIG [--resume [DIR]] (see configs/)");
}

void on_every_rank(const TrainConfig& c, const std::function<void(Communicator&, Device&)>& work) {
  // The engine's own start-up log (its plan) is in the config box already.
  if (std::getenv(std::string(env::kLogLevel).c_str()) == nullptr) log::set_level(log::Level::warn);
  const DeviceOptions dev{.memory_budget = c.run.device_memory};
  // One process under a launcher (zeroth launch -n 1, for its restarts) with local ranks runs
  // them as threads, as it would alone.
  if (const auto launched = rendezvous_from_env(); launched && !(launched->world_size == 1 && c.run.backend == "local")) {
    log::set_rank(launched->rank);
    if (c.run.backend != "gloo") {
      ZEROTH_THROW(ConfigError, "run.backend = \"{}\" with run.device = \"{}\": the GPT model runs on the CPU device, over gloo",
                   c.run.backend, c.run.device);
    }
    share_cores(launched->local_world_size);
    auto comm = make_gloo_communicator(*launched);
    auto device = make_device(c.run.device, dev);
    work(*comm, *device);
    return;
  }
  share_cores(c.run.world_size);
  run_local_ranks(c.run.world_size, [&](Communicator& comm) {
    auto device = make_device(c.run.device, dev);
    work(comm, *device);
  });
}

void add_run_config_options(CLI::App* cmd, RunConfigArgs& args, const std::string& use, const std::string& config_help,
                            const std::string& set_example) {
  cmd->add_option("config", args.config, config_help);
  cmd->add_option("--set", args.overrides, "Override a key: " + set_example)
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--resume", args.resume,
                  use + " a checkpoint: a checkpoint folder (its latest), a step folder, or a run's folder (its checkpoints); "
                        "without a value, run.checkpoint_dir")
      ->expected(0, 1)
      ->default_str("-");
}

TrainConfig load_run_config(RunConfigArgs& args, bool trained_weights) {
  untangle_resume(args.config, args.resume);
  return load_run_config(args.config, args.overrides, args.resume, trained_weights);
}

double parse_count(const std::string& text, const char* flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = used > 0 ? text.substr(used) : "";
  const double scale = unit.empty()                 ? 1
                       : unit == "K" || unit == "k" ? 1e3
                       : unit == "M"                ? 1e6
                       : unit == "B" || unit == "G" ? 1e9
                       : unit == "T"                ? 1e12
                                                    : 0;
  if (used == 0 || scale == 0 || !(v > 0))
    ZEROTH_THROW(InvalidArgument, "{} {}: give a count such as 7.5B, 350M, 1T or 175e9", flag, text);
  if (v * scale >= 1e19) ZEROTH_THROW(InvalidArgument, "{} {}: too large (below 1e19)", flag, text);
  return v * scale;
}

void add_gpt_shape_options(CLI::App* cmd, GptShape& shape, const std::string& role) {
  cmd->add_option("--layers", shape.layers, role + ": transformer layers (with --hidden and --heads)")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--hidden", shape.hidden, "Hidden size")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--heads", shape.heads, "Attention heads")->check(CLI::Range(1, 1 << 14));
  cmd->add_option("--seq", shape.seq_len, fmt::format("Sequence length (default {})", shape.seq_len))
      ->check(CLI::Range(1, GptConfig::kMaxSeqLen));
  cmd->add_option("--vocab", shape.vocab, fmt::format("Vocabulary (default {})", shape.vocab))->check(CLI::Range(1, 1 << 24));
}

bool gpt_shape_given(const GptShape& shape) { return shape.layers > 0 || shape.hidden > 0 || shape.heads > 0; }

const GptShape& checked_gpt_shape(const GptShape& shape) {
  if (const std::string bad = shape.problem(); !bad.empty()) ZEROTH_THROW(InvalidArgument, "--layers/--hidden/--heads: {}", bad);
  return shape;
}

GptConfig checked_preset(const std::string& name) {
  try {
    return GptConfig::preset(name);
  } catch (const ConfigError&) {
    ZEROTH_THROW(InvalidArgument, "--model {} is not a known preset; use one of {}", name, fmt::join(GptConfig::preset_names(), ", "));
  }
}

GptShape preset_shape(const std::string& name, uint64_t seq_len, uint64_t vocab_option) {
  if (vocab_option != GptShape{0, 0, 0, 2048, 51200}.vocab)
    ZEROTH_THROW(InvalidArgument, "--vocab goes with --layers, --hidden and --heads: --model {} has its own vocabulary", name);
  const GptConfig g = checked_preset(name);
  const auto u = [](int v) { return static_cast<uint64_t>(v); };
  if (!g.llama()) return GptShape{u(g.n_layer), u(g.n_embd), u(g.n_head), seq_len, u(g.vocab_size)};
  GptShape s = GptShape::llama_shape(u(g.n_layer), u(g.n_embd), u(g.n_head), u(g.kv_heads()), u(g.ffn()), seq_len, u(g.vocab_size),
                                     g.tie_word_embeddings);
  s.qkv_bias = g.qkv_bias;
  return s;
}

}  // namespace zeroth::tools
