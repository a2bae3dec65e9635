// The typed reader of one config object.
#include "core/config_section.h"

#include <algorithm>  // std::find
#include <cmath>      // std::floor

#include <fmt/format.h>  // fmt::format

#include "core/error.h"    // ZEROTH_THROW
#include "core/strings.h"  // did_you_mean

namespace zeroth {

using json = nlohmann::json;

namespace {

thread_local ConfigErrors* g_reading = nullptr;

}  // namespace

ConfigErrors::ConfigErrors() : outer_(g_reading) { g_reading = this; }

ConfigErrors::~ConfigErrors() { g_reading = outer_; }

void ConfigErrors::key(std::string message) {
  if (g_reading == nullptr) throw ConfigError(std::move(message));
  auto& errors = g_reading->errors_;
  // A section read twice (the top level is) records its mistake once.
  if (std::find(errors.begin(), errors.end(), message) == errors.end()) errors.push_back(std::move(message));
}

void ConfigErrors::raise() const {
  if (errors_.empty()) return;
  if (errors_.size() == 1) throw ConfigError(errors_[0]);
  std::string all = fmt::format("{} mistakes in the config:", errors_.size());
  for (const auto& e : errors_) all += "\n  - " + e;
  throw ConfigError(all);
}

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

ConfigSection::ConfigSection(const json& j, std::string path, std::span<const std::string_view> keys) : j_(j), path_(std::move(path)) {
  if (!j_.is_object()) ZEROTH_THROW(ConfigError, "{} must be an object, got {}", path_, j_.dump());
  for (const auto& [key, v] : j_.items()) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      ZEROTH_KEY_ERROR("{} is not a known key{}", at(key), did_you_mean(key, keys));
      refused_.push_back(key);
    } else if (is_auto(v)) {
      ZEROTH_KEY_ERROR("{} is \"auto\", which zeroth cannot resolve for this key; give a value", at(key));
      refused_.push_back(key);
    }
  }
}

std::string ConfigSection::at(std::string_view key) const { return path_.empty() ? std::string(key) : path_ + "." + std::string(key); }

bool ConfigSection::has(const char* key) const {
  return j_.contains(key) && !j_[key].is_null() && std::find(refused_.begin(), refused_.end(), key) == refused_.end();
}

int64_t ConfigSection::integer(const char* key, int64_t def, int64_t lo, int64_t hi, std::string_view what) const {
  if (!has(key)) return def;
  const auto& v = j_[key];
  const bool whole = v.is_number() && std::floor(v.get<double>()) == v.get<double>();
  if (!whole || v.get<double>() < static_cast<double>(lo) || v.get<double>() > static_cast<double>(hi)) {
    ZEROTH_KEY_ERROR("{} must be {}, got {}", at(key),
                     what.empty() ? fmt::format("an integer in [{}, {}]", lo, hi) : std::string(what), v.dump());
    return def;
  }
  return static_cast<int64_t>(v.get<double>());
}

double ConfigSection::number(const char* key, double def, double lo, double hi, std::string_view what) const {
  if (!has(key)) return def;
  const auto& v = j_[key];
  if (!v.is_number() || v.get<double>() < lo || v.get<double>() > hi) {
    ZEROTH_KEY_ERROR("{} must be {}, got {}", at(key), what.empty() ? fmt::format("a number in [{}, {}]", lo, hi) : std::string(what),
                     v.dump());
    return def;
  }
  return v.get<double>();
}

bool ConfigSection::flag(const char* key, bool def) const {
  if (!has(key)) return def;
  if (!j_[key].is_boolean()) {
    ZEROTH_KEY_ERROR("{} must be true or false, got {}", at(key), j_[key].dump());
    return def;
  }
  return j_[key].get<bool>();
}

std::string ConfigSection::string(const char* key, std::string def, std::span<const std::string_view> choices) const {
  if (!has(key)) return def;
  const auto& v = j_[key];
  if (!v.is_string()) {
    ZEROTH_KEY_ERROR("{} must be a string, got {}", at(key), v.dump());
    return def;
  }
  std::string s = v.get<std::string>();
  if (!choices.empty() && std::find(choices.begin(), choices.end(), s) == choices.end()) {
    std::string list;
    for (auto c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
    ZEROTH_KEY_ERROR("{} = \"{}\" is not one of: {}{}", at(key), s, list, did_you_mean(s, choices));
    return def;
  }
  return s;
}

}  // namespace zeroth
