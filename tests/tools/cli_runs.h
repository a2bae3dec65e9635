// Running the `zeroth` binary in tests: a tiny GPT config, a run's exit code, output and metrics.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "tests/engine/tensor_error.h"
#include "tests/process_util.h"

namespace zeroth::testing {

using json = nlohmann::json;

inline std::string temp(const std::string& name) { return ::testing::TempDir() + "train_" + name; }

// A file's bytes ("" when it cannot be read).
inline std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// `zeroth estimate --config CONFIG --json` with `sets` (--set pairs) as the run would be given
// them: the whole JSON, and the config's own row in `mine` (null when none is marked).
inline json estimate_with(const std::string& config, const std::vector<std::string>& sets, const std::string& name, json& mine) {
  std::vector<std::string> args = {ZEROTH_BIN, "estimate", "--config", config, "--json"};
  args.insert(args.end(), sets.begin(), sets.end());
  auto est = testing::spawn(args, {}, temp(name) + ".estimate");
  EXPECT_EQ(testing::wait_exit(est, std::chrono::seconds(60)), 0) << est.output();
  // Warnings (a schedule shorter than its warm-up at 2 steps) come before the JSON.
  const std::string text = est.output();
  const size_t at = text.find("{\n");
  const json estimate = at == std::string::npos ? json() : json::parse(text.substr(at), nullptr, false);
  mine = json();
  if (estimate.is_object() && estimate.contains("rows"))
    for (const auto& r : estimate.at("rows"))
      if (r.value("config", false)) mine = r;
  return estimate;
}

// A tiny GPT on synthetic data: 2 ranks, ZeRO-3, 6 steps, validation every 3.
inline json tiny(const std::string& name) {
  json j = json::parse(R"({
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 2, "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 16},
    "data": {"format": "synthetic", "vocab_size": 64, "tokens": 65536},
    "run": {"steps": 6, "eval_interval": 3, "eval_batches": 2, "world_size": 2}})");
  j["run"]["output_dir"] = temp(name);
  return j;
}

inline std::string write_config(const std::string& name, const json& j) {
  const std::string path = temp(name) + ".json";
  std::ofstream(path) << j.dump(2);
  return path;
}

// tiny(name) for `steps` steps on `backend` at a constant learning rate of 0.002 (every step moves
// the weights), validation only at the ends, its output folder cleared; the keys of `run` set
// over it. The config file's path.
inline std::string tiny_config(const std::string& name, int steps, const std::string& backend, const json& run = json::object()) {
  json j = tiny(name);
  j["run"]["steps"] = steps;
  j["run"]["eval_interval"] = 0;
  j["run"]["backend"] = backend;
  j["run"]["trace"] = false;
  j["run"].update(run);
  j["scheduler"] = json::parse(R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0.002, "warmup_max_lr": 0.002}})");
  std::filesystem::remove_all(temp(name));
  return write_config(name, j);
}

struct Run {
  int code;
  std::string output;
  std::vector<json> metrics;  // <output_dir>/metrics.jsonl, one record per line
};

// The records of temp(name)/metrics.jsonl. A line cut short (a run killed while writing it) is
// skipped, as a reader of the file would.
inline std::vector<json> metrics_in(const std::string& name) {
  std::vector<json> out;
  std::ifstream in(temp(name) + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (json m = json::parse(line, nullptr, false); !m.is_discarded()) out.push_back(std::move(m));
  return out;
}

inline Run run(const std::vector<std::string>& args, const std::string& name,
               std::chrono::seconds timeout = std::chrono::seconds(300)) {
  auto child = testing::spawn(args, {}, temp(name) + ".out");
  const int code = testing::wait_exit(child, timeout);
  return {code, child.output(), metrics_in(name)};
}

// `train CONFIG` into temp(name), without validation between the ends, with `sets` as --set
// overrides: the arguments after the binary.
inline std::vector<std::string> example_args(const std::string& config, const std::string& name,
                                             const std::vector<std::string>& sets) {
  std::vector<std::string> args = {"train", config, "--set", "run.output_dir=" + temp(name), "--set", "run.eval_interval=0"};
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  return args;
}

inline std::vector<std::string> with_binary(std::vector<std::string> prefix, const std::vector<std::string>& args) {
  prefix.insert(prefix.end(), args.begin(), args.end());
  return prefix;
}

// `zeroth train CONFIG` into temp(name), cleared first.
inline Run train_example(const std::string& config, const std::string& name, const std::vector<std::string>& sets) {
  std::filesystem::remove_all(temp(name));
  return run(with_binary({ZEROTH_BIN}, example_args(config, name, sets)), name);
}

// The same run continued from the checkpoint it left in temp(name) (`--resume`).
inline Run resume_example(const std::string& config, const std::string& name, const std::vector<std::string>& sets) {
  auto args = with_binary({ZEROTH_BIN}, example_args(config, name, sets));
  args.push_back("--resume");
  return run(args, name);
}

// The run as `ranks` Gloo processes under `zeroth launch`, into temp(name), cleared first.
inline Run gloo_example(const std::string& config, const std::string& name, int ranks, std::vector<std::string> sets) {
  std::filesystem::remove_all(temp(name));
  sets.push_back("run.backend=gloo");
  return run(with_binary({ZEROTH_BIN, "launch", "-n", std::to_string(ranks), "--", ZEROTH_BIN}, example_args(config, name, sets)),
             name);
}

// A constant learning rate of 0.002 from the first step (the example configs' warm-up starts at 0),
// so that every step of a short equivalence run moves the weights.
inline const std::string kConstantLr = R"(scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 0.002, "warmup_max_lr": 0.002}})";

// Every tensor of two weights files within `bound` of its largest value (the key bias aside:
// tests/engine/tensor_error.h says why); the worst is printed.
inline void expect_same_weights(const std::string& a_path, const std::string& b_path, double bound) {
  const SafeTensors a = read_safetensors(a_path), b = read_safetensors(b_path);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  double worst = 0;
  std::string where;
  for (const auto& [name, t] : b.tensors) {
    ASSERT_TRUE(a.tensors.count(name)) << name;
    const TensorError e = compare(name, a.at(name).as_f32(), t.as_f32());
    EXPECT_LE(e.rel(), bound) << name << ": max |difference| " << e.max_abs << " of max |value| " << e.scale;
    if (e.rel() >= worst) worst = e.rel(), where = name;
  }
  std::printf("weights: worst relative difference %.3g (%s)\n", worst, where.c_str());
}

inline std::string weights_of(const std::string& name) { return temp(name) + "/model.safetensors"; }

inline std::vector<double> losses(const Run& r) {
  std::vector<double> out;
  for (const auto& m : r.metrics) {
    if (m.contains("loss") && m.contains("lr")) out.push_back(m["loss"]);
  }
  return out;
}

// The last loss recorded for each step: a restarted run records again the steps it redoes.
inline std::map<int, double> losses_by_step(const std::vector<json>& metrics) {
  std::map<int, double> out;
  for (const auto& m : metrics)
    if (m.contains("loss") && m.contains("lr") && m.contains("step")) out[m["step"].get<int>()] = m["loss"];
  return out;
}

}  // namespace zeroth::testing
