// The typed reader of one config object.
#include "core/config_section.h"

#include <algorithm>  // std::find
#include <cmath>      // std::floor

#include <fmt/format.h>  // fmt::format

#include "core/error.h"    // ZEROTH_THROW
#include "core/strings.h"  // did_you_mean

namespace zeroth {

using json = nlohmann::json;

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

ConfigSection::ConfigSection(const json& j, std::string path, std::span<const std::string_view> keys) : j_(j), path_(std::move(path)) {
  if (!j_.is_object()) ZEROTH_THROW(ConfigError, "{} must be an object, got {}", path_, j_.dump());
  for (const auto& [key, v] : j_.items()) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      ZEROTH_THROW(ConfigError, "{} is not a known key{}", at(key), did_you_mean(key, keys));
    }
    if (is_auto(v)) ZEROTH_THROW(ConfigError, "{} is \"auto\", which zeroth cannot resolve for this key; give a value", at(key));
  }
}

std::string ConfigSection::at(std::string_view key) const { return path_.empty() ? std::string(key) : path_ + "." + std::string(key); }

bool ConfigSection::has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

int64_t ConfigSection::integer(const char* key, int64_t def, int64_t lo, int64_t hi, std::string_view what) const {
  if (!has(key)) return def;
  const auto& v = j_[key];
  const bool whole = v.is_number() && std::floor(v.get<double>()) == v.get<double>();
  if (!whole || v.get<double>() < static_cast<double>(lo) || v.get<double>() > static_cast<double>(hi)) {
    ZEROTH_THROW(ConfigError, "{} must be {}, got {}", at(key),
                 what.empty() ? fmt::format("an integer in [{}, {}]", lo, hi) : std::string(what), v.dump());
  }
  return static_cast<int64_t>(v.get<double>());
}

double ConfigSection::number(const char* key, double def, double lo, double hi, std::string_view what) const {
  if (!has(key)) return def;
  const auto& v = j_[key];
  if (!v.is_number() || v.get<double>() < lo || v.get<double>() > hi) {
    ZEROTH_THROW(ConfigError, "{} must be {}, got {}", at(key),
                 what.empty() ? fmt::format("a number in [{}, {}]", lo, hi) : std::string(what), v.dump());
  }
  return v.get<double>();
}

bool ConfigSection::flag(const char* key, bool def) const {
  if (!has(key)) return def;
  if (!j_[key].is_boolean()) ZEROTH_THROW(ConfigError, "{} must be true or false, got {}", at(key), j_[key].dump());
  return j_[key].get<bool>();
}

std::string ConfigSection::string(const char* key, std::string def, std::span<const std::string_view> choices) const {
  if (!has(key)) return def;
  const auto& v = j_[key];
  if (!v.is_string()) ZEROTH_THROW(ConfigError, "{} must be a string, got {}", at(key), v.dump());
  std::string s = v.get<std::string>();
  if (!choices.empty() && std::find(choices.begin(), choices.end(), s) == choices.end()) {
    std::string list;
    for (auto c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
    ZEROTH_THROW(ConfigError, "{} = \"{}\" is not one of: {}{}", at(key), s, list, did_you_mean(s, choices));
  }
  return s;
}

}  // namespace zeroth
