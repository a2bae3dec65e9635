// Parsing and validation of the engine's part of a DeepSpeed config.
#include "engine/config.h"

#include <fnmatch.h>  // fnmatch

#include <algorithm>    // std::find, std::none_of
#include <string>       // std::string
#include <string_view>  // std::string_view

#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"    // ZEROTH_THROW
#include "core/strings.h"  // did_you_mean

namespace zeroth {
namespace {

constexpr std::string_view kZeroKeys[] = {
    "stage", "reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients", "reduce_scatter",
    "allgather_partitions", "stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_param_persistence_threshold", "offload_optimizer", "offload_param", "sub_group_size",
    "load_from_fp32_weights", "elastic_checkpoint", "round_robin_gradients", "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters", "cpu_offload", "zero_hpz_partition_size",
    "zero_quantized_weights", "zero_quantized_gradients", "zero_quantized_nontrainable_weights", "mics_shard_size",
    "mics_hierarchical_params_gather", "memory_efficient_linear", "pipeline_loading_checkpoint",
    "override_module_apply", "use_multi_rank_bucket_allreduce", "module_granularity_threshold",
    "use_all_reduce_for_fetch_params", "prefetch_bucket_size", "param_persistence_threshold",
    "max_live_parameters", "max_reuse_distance", "log_trace_cache_warnings", "legacy_stage1"};

// Keys DeepSpeed accepts that change what the engine does in ways zeroth does not (yet) do.
// They are errors when set to anything but their inert default, never silently ignored.
bool inert(const std::string& key, const nlohmann::json& v) {
  if (key == "zero_hpz_partition_size") return v.is_number() && v.get<double>() <= 1;
  if (key == "mics_shard_size") return v.is_number() && v.get<double>() < 0;
  if (key == "offload_optimizer" || key == "offload_param") {
    return v.is_null() || (v.is_object() && v.value("device", std::string("none")) == "none");
  }
  if (key == "cpu_offload") return v.is_boolean() && !v.get<bool>();
  if (key.starts_with("zero_quantized") || key == "round_robin_gradients" || key == "legacy_stage1" ||
      key == "mics_hierarchical_params_gather" || key == "use_multi_rank_bucket_allreduce" ||
      key == "use_all_reduce_for_fetch_params") {
    return v.is_boolean() && !v.get<bool>();
  }
  // Affect only checkpoint conventions, logging or module hooks that the block API does not have.
  return key == "load_from_fp32_weights" || key == "elastic_checkpoint" || key == "ignore_unused_parameters" ||
         key == "stage3_gather_16bit_weights_on_model_save" || key == "stage3_gather_fp16_weights_on_model_save" ||
         key == "memory_efficient_linear" || key == "pipeline_loading_checkpoint" || key == "override_module_apply" ||
         key == "log_trace_cache_warnings" || key == "allgather_partitions" ||
         key == "module_granularity_threshold";
}

uint64_t count(const nlohmann::json& v, const std::string& key) {
  if (v.is_string() && v.get<std::string>() == "auto") {
    ZEROTH_THROW(ConfigError, "zero_optimization.{} is \"auto\": auto values are resolved by the training config; here it must be a number", key);
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
  bool overlap_set = false;
  for (const auto& [key, v] : section.items()) {
    if (std::find(std::begin(kZeroKeys), std::end(kZeroKeys), key) == std::end(kZeroKeys)) {
      ZEROTH_THROW(ConfigError, "zero_optimization.{} is not a known key{}", key, did_you_mean(key, kZeroKeys));
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
    } else if (key == "contiguous_gradients") {
      z.contiguous_gradients = flag(v, key);
    } else if (key == "reduce_scatter") {
      z.reduce_scatter = flag(v, key);
    } else if (key == "stage3_prefetch_bucket_size" || key == "prefetch_bucket_size") {
      z.stage3_prefetch_bucket_size = count(v, key);
    } else if (key == "stage3_max_live_parameters" || key == "max_live_parameters") {
      z.stage3_max_live_parameters = count(v, key);
    } else if (key == "stage3_max_reuse_distance" || key == "max_reuse_distance") {
      z.stage3_max_reuse_distance = count(v, key);
    } else if (key == "stage3_param_persistence_threshold" || key == "param_persistence_threshold") {
      z.stage3_param_persistence_threshold = count(v, key);
    } else if (key == "sub_group_size") {
      z.sub_group_size = count(v, key);
    } else if (!inert(key, v)) {
      if (key == "offload_optimizer" || key == "offload_param" || key == "cpu_offload") {
        ZEROTH_THROW(ConfigError, "zero_optimization.{} = {}: offloading is not available in this build of the engine; remove the key or set its device to \"none\"",
                     key, v.dump());
      }
      ZEROTH_THROW(ConfigError, "zero_optimization.{} = {} is a DeepSpeed option zeroth does not support; remove it", key,
                   v.dump());
    }
  }
  if (!overlap_set) z.overlap_comm = z.stage == 3;
  z.validate();
  return z;
}

void ZeroConfig::validate() const {
  if (stage < 0 || stage > 3) ZEROTH_THROW(ConfigError, "zero_optimization.stage must be 0, 1, 2 or 3, got {}", stage);
  if (reduce_bucket_size == 0) ZEROTH_THROW(ConfigError, "zero_optimization.reduce_bucket_size must be at least 1 element");
  if (sub_group_size == 0) ZEROTH_THROW(ConfigError, "zero_optimization.sub_group_size must be at least 1 element");
  if (allgather_bucket_size == 0) {
    ZEROTH_THROW(ConfigError, "zero_optimization.allgather_bucket_size must be at least 1 element");
  }
  if (!reduce_scatter && stage >= 1) {
    ZEROTH_THROW(ConfigError, "zero_optimization.reduce_scatter = false with stage {}: zeroth reduces sharded gradients with reduce-scatter only (half the traffic of all-reduce); remove the key", stage);
  }
}

namespace {

constexpr std::pair<std::string_view, ParamRole> kRoles[] = {
    {"weight", ParamRole::weight}, {"bias", ParamRole::bias}, {"norm", ParamRole::norm}, {"embedding", ParamRole::embedding}};

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
      const std::string example = specs.empty() || specs.front().params.empty() ? "" : " (e.g. \"" + specs.front().name + "." + specs.front().params.front().name + "\")";
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
