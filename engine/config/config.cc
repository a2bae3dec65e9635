// Parsing and validation of the engine's part of a DeepSpeed config.
#include "engine/config/config.h"

#include <fnmatch.h>  // fnmatch

#include <algorithm>    // std::find, std::none_of
#include <string>       // std::string
#include <string_view>  // std::string_view

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"                    // ZEROTH_THROW
#include "core/config_section.h"           // ConfigSection
#include "engine/config/deepspeed_keys.h"  // without_deepspeed_extras

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

}  // namespace

// Long: zero_optimization's keys in DeepSpeed's order, then its old cpu_offload names, then what each stage ignores; split,
// one section's keys would sit in several functions.
ZeroConfig ZeroConfig::from_deepspeed(const nlohmann::json& section) {
  if (!section.is_object()) ZEROTH_THROW(ConfigError, "zero_optimization must be an object like {{\"stage\": 2}}");
  ZeroConfig z;
  const nlohmann::json own = without_deepspeed_extras(section, "zero_optimization", kZeroKeys, z.no_effect, UnknownKeys::refuse,
                                                      AutoValues::mean_default);
  const ConfigSection s(own, "zero_optimization", kZeroKeys);
  // Element counts: DeepSpeed takes them as numbers (5e8), and so does zeroth.
  // Of a key and its alias, both are checked and the key wins, as DeepSpeed reads them.
  auto count = [&](const char* key, const char* alias, uint64_t def) {
    auto read = [&](const char* k, double d) { return s.number(k, d, 0, 1e18, "a non-negative number of elements"); };
    const double from_alias = alias != nullptr ? read(alias, static_cast<double>(def)) : static_cast<double>(def);
    return static_cast<uint64_t>(read(key, from_alias));
  };
  z.stage = static_cast<int>(s.integer("stage", z.stage, 0, 3, "0, 1, 2 or 3"));
  z.reduce_bucket_size = count("reduce_bucket_size", nullptr, z.reduce_bucket_size);
  z.allgather_bucket_size = count("allgather_bucket_size", nullptr, z.allgather_bucket_size);
  const bool overlap_set = s.has("overlap_comm");
  z.overlap_comm = s.flag("overlap_comm", z.overlap_comm);
  z.stage3_prefetch_bucket_size = count("stage3_prefetch_bucket_size", "prefetch_bucket_size", z.stage3_prefetch_bucket_size);
  z.stage3_max_live_parameters = count("stage3_max_live_parameters", "max_live_parameters", z.stage3_max_live_parameters);
  z.stage3_max_reuse_distance = count("stage3_max_reuse_distance", "max_reuse_distance", z.stage3_max_reuse_distance);
  z.stage3_param_persistence_threshold = count("stage3_param_persistence_threshold", "param_persistence_threshold",
                                               z.stage3_param_persistence_threshold);
  // Three names of one flag; where several are given, the last in this order wins, as before.
  for (const char* k :
       {"gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save"})
    z.gather_16bit_weights_on_model_save = s.flag(k, z.gather_16bit_weights_on_model_save);
  z.sub_group_size = count("sub_group_size", nullptr, z.sub_group_size);
  if (s.has("offload_optimizer"))
    z.offload_optimizer = OffloadConfig::from_deepspeed(s.raw("offload_optimizer"), "zero_optimization.offload_optimizer", false);
  if (s.has("offload_param"))
    z.offload_param = OffloadConfig::from_deepspeed(s.raw("offload_param"), "zero_optimization.offload_param", true);
  const bool legacy_optimizer = s.flag("cpu_offload", false);
  const bool legacy_param = s.flag(s.has("cpu_offload_params") ? "cpu_offload_params" : "cpu_offload_param", false);
  const bool legacy_pin = s.flag("cpu_offload_use_pin_memory", false);
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
  if (offload_optimizer.delayed_update && !offload_optimizer.enabled()) {
    ZEROTH_THROW(ConfigError,
                 "zero_optimization.offload_optimizer.delayed_update needs offload_optimizer.device \"cpu\" or \"nvme\": the delayed "
                 "update is the host's, run beside the device's next step");
  }
  if (offload_optimizer.delayed_update && offload_optimizer.ratio < 1.0) {
    ZEROTH_THROW(ConfigError,
                 "zero_optimization.offload_optimizer.delayed_update with ratio = {}: the sub-groups kept on the device are updated "
                 "in place, which a delayed update cannot do under the next step; set ratio to 1 or turn delayed_update off",
                 offload_optimizer.ratio);
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
