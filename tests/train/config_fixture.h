// The configs the training-config tests extend, and the error text a config gives.
#pragma once

#include <exception>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/config/train_config.h"

namespace zeroth::config_fixture {

using json = nlohmann::json;

// A base every case extends: a tiny model on synthetic data.
inline json base() {
  return json::parse(R"({"train_micro_batch_size_per_gpu": 2, "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "seq_len": 8}})");
}

inline json with(json j, const std::string& patch) {
  j.merge_patch(json::parse(patch));
  return j;
}

// The message without the " [file:line]" breadcrumb errors carry.
inline std::string message(const std::exception& e) {
  std::string s = e.what();
  const auto at = s.rfind(" [");
  return at == std::string::npos ? s : s.substr(0, at);
}

inline std::string error_of(const json& j, int launched = 0) {
  try {
    TrainConfig::from_json(j, launched);
  } catch (const ConfigError& e) {
    return message(e);
  }
  return "(no error)";
}

}  // namespace zeroth::config_fixture
