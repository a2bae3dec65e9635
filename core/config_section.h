// One object of a JSON config read as typed fields: every message names the key's full path
// ("zero_optimization.stage must be an integer in [0, 3], got 4"), an unknown key is an error with
// a "did you mean" from the known ones, and DeepSpeed's "auto" placeholder is refused where the
// caller has not resolved it. Every config parser reads its section through it.
#pragma once

#include <cstdint>      // int64_t
#include <exception>    // std::exception
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include <fmt/format.h>  // fmt::format

#include "core/error.h"  // ConfigError, detail::where

namespace zeroth {

// DeepSpeed's (and Hugging Face's) placeholder for a value the trainer fills in.
bool is_auto(const nlohmann::json& v);

// One read of a whole config that names its keys' mistakes at once, as DeepSpeed's config model
// does: while it is in scope on a thread, a key's wrong value, an unknown key or a refused "auto"
// (ConfigSection's checks, ZEROTH_KEY_ERROR) is recorded and the key's default stands in, so the
// read goes on. A check that raises (across keys, or one not made through ConfigSection) ends the
// read; it is named only when nothing was recorded before it, since after a mistake the values it
// saw may be stand-ins and what it says may follow from the mistake already named (a config
// validator of DeepSpeed's runs once its fields are valid, for the same reason).
class ConfigErrors {
 public:
  ConfigErrors();
  ~ConfigErrors();
  ConfigErrors(const ConfigErrors&) = delete;
  ConfigErrors& operator=(const ConfigErrors&) = delete;

  // Runs one section's read, unless an earlier one stopped: a key's mistake is recorded and the
  // read goes on with its default, but a section that raises stops the reading there, since it
  // may have left its part of the config half made (later sections would read it). The error is
  // recorded if nothing was before it; another kind of error is raised then, else dropped.
  template <typename F>
  void section(F&& read) {
    if (stopped_) return;
    try {
      read();
    } catch (const ConfigError& e) {
      stopped_ = true;
      if (errors_.empty()) errors_.push_back(e.what());
    } catch (const std::exception&) {
      stopped_ = true;
      // A value of the wrong type read past its named mistake (a stand-in's neighbour).
      if (errors_.empty()) throw;
    }
  }
  // ConfigError naming every recorded mistake (one line each), if there is one.
  void raise() const;

  // A mistake in one key: recorded where a ConfigErrors is reading on this thread, else raised.
  static void key(std::string message);

 private:
  std::vector<std::string> errors_;
  bool stopped_ = false;
  ConfigErrors* outer_;
};

// Records (under a ConfigErrors) or raises a mistake in one key, with its source location as
// ZEROTH_THROW gives one. The caller goes on as if the key were absent.
#define ZEROTH_KEY_ERROR(...) \
  ::zeroth::ConfigErrors::key(fmt::format(__VA_ARGS__) + " [" + ::zeroth::detail::where(__FILE__, __LINE__) + "]")

class ConfigSection {
 public:
  // `j` must be an object whose keys are all in `keys` and none "auto" (ConfigError otherwise; under
  // a ConfigErrors, the other keys are recorded and left out); `path` is its place in the config
  // ("" at the top level). `j` must outlive the section.
  ConfigSection(const nlohmann::json& j, std::string path, std::span<const std::string_view> keys);

  std::string at(std::string_view key) const;  // the key's full path
  bool has(const char* key) const;             // present, not null and not refused (an "auto")
  const nlohmann::json& raw(const char* key) const { return j_[key]; }

  // The key's value, `def` when absent; otherwise ConfigError "<path> must be <what>, got <value>",
  // `what` by default naming the range ("an integer in [1, 4096]"); under a ConfigErrors, the
  // mistake is recorded and `def` returned.
  int64_t integer(const char* key, int64_t def, int64_t lo, int64_t hi, std::string_view what = {}) const;
  double number(const char* key, double def, double lo, double hi, std::string_view what = {}) const;
  bool flag(const char* key, bool def) const;
  // With `choices`, the value must be one of them.
  std::string string(const char* key, std::string def, std::span<const std::string_view> choices = {}) const;

 private:
  const nlohmann::json& j_;
  std::string path_;
  std::vector<std::string> refused_;
};

}  // namespace zeroth
