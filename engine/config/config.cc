// Parsing and validation of the engine's part of a DeepSpeed config.
#include "engine/config/config.h"

#include <fnmatch.h>  // fnmatch

#include <algorithm>    // std::find, std::none_of
#include <string>       // std::string
#include <string_view>  // std::string_view

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"                    // ZEROTH_THROW
#include "core/strings.h"                  // did_you_mean
#include "engine/config/deepspeed_keys.h"  // handle_deepspeed_key

namespace zeroth {
namespace {

// The keys zeroth reads; the rest of DeepSpeed's vocabulary is in engine/config/deepspeed_keys.cc.
constexpr std::string_view kZeroKeys[] = {"stage",
                                          "stage3_gather_16bit_weights_on_model_save",
                                          "gather_16bit_weights_on_model_save",
                                          "stage3_gather_fp16_weights_on_model_save",
                                          "reduce_bucket_size",
                                          "allgather_bucket_size",
                                          "overlap_comm",
                                          "stage3_prefetch_bucket_size",
                                          "prefetch_bucket_size",
                                          "stage3_max_live_parameters",
                                          "max_live_parameters",
                                          "stage3_max_reuse_distance",
                                          "max_reuse_distance",
                                          "stage3_param_persistence_threshold",
                                          "param_persistence_threshold",
                                          "sub_group_size",
                                          "offload_optimizer",
                                          "offload_param",
                                          "cpu_offload",
                                          "cpu_offload_param",
                                          "cpu_offload_params",
                                          "cpu_offload_use_pin_memory"};

uint64_t count(const nlohmann::json& v, const std::string& key) {
  if (v.is_string() && v.get<std::string>() == "auto") {
    ZEROTH_THROW(ConfigError,
                 "zero_optimization.{} is \"auto\": auto values are resolved by the training config; here it must be a number", key);
  }
  if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 1e18) {
    ZEROTH_THROW(ConfigError, "zero_optimization.{} must be a non-negative number of elements, got {}", key, v.dump());
  }
  return static_cast<uint64_t>(v.get<double>());
}

bool flag(const nlohmann::json& v, const std::string& key) {
  if (!v.is_boolean()) ZEROTH_THROW(ConfigError, "zero_optimization.{} must be true or false, got {}", key, v.dump());
  return v.get<bool>();
}

}  // namespace

ZeroConfig ZeroConfig::from_deepspeed(const nlohmann::json& section) {
  if (!section.is_object()) ZEROTH_THROW(ConfigError, "zero_optimization must be an object like {{\"stage\": 2}}");
  ZeroConfig z;
  bool overlap_set = false, legacy_optimizer = false, legacy_param = false, legacy_pin = false;
  for (const auto& [key, v] : section.items()) {
    if (std::find(std::begin(kZeroKeys), std::end(kZeroKeys), key) == std::end(kZeroKeys)) {
      if (handle_deepspeed_key("zero_optimization", key, v, &z.no_effect)) continue;
      std::vector<std::string_view> known(std::begin(kZeroKeys), std::end(kZeroKeys));
      for (auto k : deepspeed_key_names("zero_optimization")) known.push_back(k);
      ZEROTH_THROW(ConfigError, "zero_optimization.{} is not a known key{}", key, did_you_mean(key, known));
    }
    if (key == "stage") {
      if (!v.is_number_integer()) ZEROTH_THROW(ConfigError, "zero_optimization.stage must be 0, 1, 2 or 3, got {}", v.dump());
      z.stage = v.get<int>();
    } else if (key == "reduce_bucket_size") {
      z.reduce_bucket_size = count(v, key);
    } else if (key == "allgather_bucket_size") {
      z.allgather_bucket_size = count(v, key);
    } else if (key == "overlap_comm") {
      z.overlap_comm = flag(v, key);
      overlap_set = true;
    } else if (key == "stage3_prefetch_bucket_size" || key == "prefetch_bucket_size") {
      z.stage3_prefetch_bucket_size = count(v, key);
    } else if (key == "stage3_max_live_parameters" || key == "max_live_parameters") {
      z.stage3_max_live_parameters = count(v, key);
    } else if (key == "stage3_max_reuse_distance" || key == "max_reuse_distance") {
      z.stage3_max_reuse_distance = count(v, key);
    } else if (key == "stage3_param_persistence_threshold" || key == "param_persistence_threshold") {
      z.stage3_param_persistence_threshold = count(v, key);
    } else if (key == "stage3_gather_16bit_weights_on_model_save" || key == "gather_16bit_weights_on_model_save" ||
               key == "stage3_gather_fp16_weights_on_model_save") {
      z.gather_16bit_weights_on_model_save = flag(v, key);
    } else if (key == "sub_group_size") {
      z.sub_group_size = count(v, key);
    } else if (key == "offload_optimizer") {
      z.offload_optimizer = OffloadConfig::from_deepspeed(v, "zero_optimization.offload_optimizer", false);
    } else if (key == "offload_param") {
      z.offload_param = OffloadConfig::from_deepspeed(v, "zero_optimization.offload_param", true);
    } else if (key == "cpu_offload") {
      legacy_optimizer = !v.is_null() && flag(v, key);
    } else if (key == "cpu_offload_param" || key == "cpu_offload_params") {
      legacy_param = !v.is_null() && flag(v, key);
    } else if (key == "cpu_offload_use_pin_memory") {
      legacy_pin = !v.is_null() && flag(v, key);
    }
  }
  // DeepSpeed's old names: `cpu_offload: true` is offload_optimizer on the CPU. Given together
  // with the new section, DeepSpeed refuses the pair (a deprecated field and its replacement);
  // so does zeroth. cpu_offload_use_pin_memory only pins what the old names offload.
  bool pin_used = false;
  auto legacy = [&](const char* old, bool on, OffloadConfig& o, const char* name) {
    if (!section.contains(old)) return;
    if (section.contains(name)) {
      ZEROTH_THROW(ConfigError,
                   "zero_optimization.{} (DeepSpeed's old name) and zero_optimization.{} are both set; DeepSpeed refuses the pair "
                   "too: keep {}",
                   old, name, name);
    }
    if (!on) return;
    o.device = OffloadDevice::cpu;
    o.pin_memory = legacy_pin;
    pin_used = true;
  };
  legacy("cpu_offload", legacy_optimizer, z.offload_optimizer, "offload_optimizer");
  legacy(section.contains("cpu_offload_params") ? "cpu_offload_params" : "cpu_offload_param", legacy_param, z.offload_param,
         "offload_param");
  if (section.contains("cpu_offload_use_pin_memory") && !pin_used) {
    z.no_effect.push_back(
        "zero_optimization.cpu_offload_use_pin_memory: it pins only what cpu_offload / cpu_offload_param offload; use "
        "offload_optimizer.pin_memory / offload_param.pin_memory");
  }
  for (const auto* o : {&z.offload_optimizer, &z.offload_param})
    z.no_effect.insert(z.no_effect.end(), o->no_effect.begin(), o->no_effect.end());
  if (!overlap_set) z.overlap_comm = z.stage == 3;
  // DeepSpeed's partial offload is a stage-3 feature; below it the whole shard is offloaded.
  if (z.offload_optimizer.ratio < 1 && z.offload_optimizer.ratio >= 0 && z.stage < 3) {
    z.no_effect.push_back(fmt::format(
        "zero_optimization.offload_optimizer.ratio = {:g}: DeepSpeed applies it at stage 3 only, so at stage {} the whole shard is "
        "offloaded",
        z.offload_optimizer.ratio, z.stage));
    z.offload_optimizer.ratio = 1;
  }
  // DeepSpeed reads offload_param at stage 3 only and ignores it below (DeepSpeed-Chat's hybrid
  // engine config sets it at stage 0).
  if (z.offload_param.enabled() && z.stage < 3) {
    z.no_effect.push_back(fmt::format(
        "zero_optimization.offload_param.device = \"{}\": DeepSpeed offloads parameters at stage 3 only, so at stage {} they stay "
        "on the device",
        offload_device_name(z.offload_param.device), z.stage));
    z.offload_param = OffloadConfig{};
  }
  z.validate();
  return z;
}

void ZeroConfig::validate() const {
  if (stage < 0 || stage > 3) ZEROTH_THROW(ConfigError, "zero_optimization.stage must be 0, 1, 2 or 3, got {}", stage);
  if (sub_group_size == 0) ZEROTH_THROW(ConfigError, "zero_optimization.sub_group_size must be at least 1 element");
  if (offload_optimizer.enabled() && stage == 0) {
    ZEROTH_THROW(ConfigError,
                 "zero_optimization.offload_optimizer.device = \"{}\" needs zero_optimization.stage 1, 2 or 3 (the offloaded state is "
                 "the rank's shard), got stage 0",
                 offload_device_name(offload_optimizer.device));
  }
  if (offload_optimizer.ratio < 0.0 || offload_optimizer.ratio > 1.0) {
    ZEROTH_THROW(ConfigError, "zero_optimization.offload_optimizer.ratio must be a fraction in [0, 1], got {}",
                 offload_optimizer.ratio);
  }
  if (offload_optimizer.ratio < 1.0 && offload_param.enabled()) {
    ZEROTH_THROW(ConfigError,
                 "zero_optimization.offload_optimizer.ratio = {} keeps part of the optimizer state on the device, but offload_param "
                 "(device \"{}\") moves every parameter shard off it: set ratio to 1, or remove offload_param",
                 offload_optimizer.ratio, offload_device_name(offload_param.device));
  }
  if (offload_param.enabled() && stage != 3) {
    ZEROTH_THROW(ConfigError,
                 "zero_optimization.offload_param.device = \"{}\" needs zero_optimization.stage 3 (got {}): only stage 3 "
                 "partitions the parameters",
                 offload_device_name(offload_param.device), stage);
  }
  if (offload_param.enabled() && !offload_optimizer.enabled()) {
    ZEROTH_THROW(
        ConfigError,
        "zero_optimization.offload_param.device = \"{}\" needs offload_optimizer too (device cpu or nvme): the updated parameters "
        "are written to their host or NVMe home by the host's optimizer step",
        offload_device_name(offload_param.device));
  }
}

namespace {

constexpr std::pair<std::string_view, ParamRole> kRoles[] = {{"weight", ParamRole::weight},
                                                             {"bias", ParamRole::bias},
                                                             {"norm", ParamRole::norm},
                                                             {"embedding", ParamRole::embedding}};

const ParamRole* role_named(const std::string& entry) {
  for (const auto& [name, role] : kRoles) {
    if (entry == name) return &role;
  }
  return nullptr;
}

bool matches(const std::string& entry, const std::string& block, const ParamSpec& param) {
  if (const ParamRole* role = role_named(entry)) return *role == param.role;
  const std::string full = block + "." + param.name;
  return fnmatch(entry.c_str(), full.c_str(), 0) == 0;
}

}  // namespace

bool WeightDecayRule::decays(const std::string& block, const ParamSpec& param) const {
  return std::none_of(exclude.begin(), exclude.end(), [&](const std::string& e) { return matches(e, block, param); });
}

void WeightDecayRule::check(const std::vector<BlockSpec>& specs) const {
  for (const auto& entry : exclude) {
    if (role_named(entry) != nullptr) continue;
    bool any = false;
    for (const auto& spec : specs) {
      for (const auto& p : spec.params) any = any || matches(entry, spec.name, p);
    }
    if (!any) {
      const std::string example = specs.empty() || specs.front().params.empty()
                                      ? ""
                                      : " (e.g. \"" + specs.front().name + "." + specs.front().params.front().name + "\")";
      ZEROTH_THROW(ConfigError,
                   "model.no_weight_decay entry \"{}\" is neither a role (weight, bias, norm, embedding) nor a pattern matching any "
                   "parameter name{}",
                   entry, example);
    }
  }
}

void EngineConfig::validate() const {
  zero.validate();
  if (gradient_accumulation_steps < 1) {
    ZEROTH_THROW(ConfigError, "gradient_accumulation_steps must be at least 1, got {}", gradient_accumulation_steps);
  }
  if (gradient_clipping < 0) ZEROTH_THROW(ConfigError, "gradient_clipping must be >= 0 (0 turns it off), got {}", gradient_clipping);
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    ZEROTH_THROW(ConfigError, "engine alignment must be a power of two, got {}", alignment);
  }
  optimizer.validate();
}

}  // namespace zeroth
