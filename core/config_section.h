// One object of a JSON config read as typed fields: every message names the key's full path
// ("zero_optimization.stage must be an integer in [0, 3], got 4"), an unknown key is an error with
// a "did you mean" from the known ones, and DeepSpeed's "auto" placeholder is refused where the
// caller has not resolved it. Every config parser reads its section through it.
#pragma once

#include <cstdint>      // int64_t
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view

#include <nlohmann/json.hpp>  // nlohmann::json

namespace zeroth {

// DeepSpeed's (and Hugging Face's) placeholder for a value the trainer fills in.
bool is_auto(const nlohmann::json& v);

class ConfigSection {
 public:
  // `j` must be an object whose keys are all in `keys` and none "auto" (ConfigError otherwise);
  // `path` is its place in the config ("" at the top level). `j` must outlive the section.
  ConfigSection(const nlohmann::json& j, std::string path, std::span<const std::string_view> keys);

  std::string at(std::string_view key) const;  // the key's full path
  bool has(const char* key) const;             // present and not null
  const nlohmann::json& raw(const char* key) const { return j_[key]; }

  // The key's value, `def` when absent; otherwise ConfigError "<path> must be <what>, got <value>",
  // `what` by default naming the range ("an integer in [1, 4096]").
  int64_t integer(const char* key, int64_t def, int64_t lo, int64_t hi, std::string_view what = {}) const;
  double number(const char* key, double def, double lo, double hi, std::string_view what = {}) const;
  bool flag(const char* key, bool def) const;
  // With `choices`, the value must be one of them.
  std::string string(const char* key, std::string def, std::span<const std::string_view> choices = {}) const;

 private:
  const nlohmann::json& j_;
  std::string path_;
};

}  // namespace zeroth
