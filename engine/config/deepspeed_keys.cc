// The table of DeepSpeed keys zeroth does not implement as DeepSpeed does, with what each does
// (from DeepSpeed's runtime/config.py, constants.py and zero/config.py) and how zeroth treats it.
#include "engine/config/deepspeed_keys.h"

#include <algorithm>  // std::find, std::any_of

#include <nlohmann/json.hpp>

#include "core/config_section.h"  // is_auto
#include "core/error.h"           // ZEROTH_THROW
#include "core/strings.h"         // closest_match, did_you_mean

namespace zeroth {
namespace {

using json = nlohmann::json;

bool is_false(const json& v) { return v.is_null() || (v.is_boolean() && !v.get<bool>()); }
bool is_true(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool is_null(const json& v) { return v.is_null(); }
bool at_most_one(const json& v) { return v.is_null() || (v.is_number() && v.get<double>() <= 1); }
bool negative(const json& v) { return v.is_null() || (v.is_number() && v.get<double>() < 0); }
bool is_zero(const json& v) { return v.is_null() || (v.is_number() && v.get<double>() == 0); }
bool mean(const json& v) { return v.is_null() || v == "mean"; }
bool unbounded(const json& v) { return v.is_null() || (v.is_number() && v.get<double>() >= 9.2e18); }
// A section that is absent, empty, or says "enabled": false.
bool disabled(const json& v) {
  if (v.is_null() || is_false(v)) return true;
  if (!v.is_object()) return false;
  return v.empty() || (v.contains("enabled") && is_false(v["enabled"]));
}

constexpr auto kNone = KeyTreatment::no_effect;
constexpr auto kUnsupported = KeyTreatment::unsupported;

constexpr std::string_view kNoNetworkMonitor =
    "sends metrics to a service over the network, and zeroth has no client for one; use `tensorboard` or `csv_monitor` (files "
    "TensorBoard and spreadsheets read), or <run.output_dir>/metrics.jsonl";
constexpr std::string_view kPytorchHooks = "it configures hooks on PyTorch modules, which zeroth's models do not have";

const DeepSpeedKey kKeys[] = {
    // ---- no effect: zeroth always does what the key asks, or it concerns something zeroth lacks
    {"memory_breakdown", kNone, "zeroth always reports peak memory per tag, in the step lines and the summary"},
    {"dump_state", kNone, "zeroth always writes the resolved config to config.json in run.output_dir (--dry-run prints it)"},
    {"zero_allow_untested_optimizer", kNone, "every zeroth optimizer runs under every ZeRO stage"},
    {"zero_force_ds_cpu_optimizer", kNone, "zeroth has one optimizer implementation per device"},
    {"disable_allgather", kNone, "zeroth always all-gathers the updated parameter shards"},
    {"timers", kNone, "zeroth always prints and records the throughput of every step"},
    {"vocabulary_size", kNone, "DeepSpeed only warns about it; zeroth's vocabulary is model.vocab_size"},
    {"disable_python_gc", kNone, "zeroth has no Python garbage collector"},
    {"dataloader_drop_last", kNone, "zeroth's loader never makes a partial batch"},
    {"seq_parallel_communication_data_type", kNone, "it applies to sequence parallelism, which this run does not have"},
    {"seq_parallel_comm_data_type", kNone, "it applies to sequence parallelism, which this run does not have"},
    {"use_data_before_expert_parallelism", kNone,
     "zeroth's expert-parallel groups are runs of consecutive data-parallel ranks (DeepSpeed's default); the other order moves "
     "experts between ranks, not what is computed"},
    {"zero_optimization.contiguous_gradients", kNone, "zeroth's gradients always live in one flat buffer per block"},
    {"zero_optimization.allgather_partitions", kNone, "zeroth always all-gathers the updated shards"},
    {"zero_optimization.reduce_scatter", kNone,
     "zeroth reduces sharded gradients with reduce-scatter and replicated ones (stage 0) with all-reduce; the sums are the same"},
    {"zero_optimization.use_multi_rank_bucket_allreduce", kNone, "zeroth issues one collective per bucket"},
    {"zero_optimization.use_all_reduce_for_fetch_params", kNone, "zeroth fetches parameters with all-gather; the values are the same"},
    {"zero_optimization.stage3_use_all_reduce_for_fetch_params", kNone,
     "zeroth fetches parameters with all-gather; the values are the same"},
    {"zero_optimization.round_robin_gradients", kNone,
     "zeroth copies each bucket's reduced gradients to the host in one transfer, in bucket order"},
    {"zero_optimization.ignore_unused_parameters", kNone, "every block of a zeroth model is used in every step (the plan checks)"},
    {"zero_optimization.elastic_checkpoint", kNone, "DeepSpeed no longer supports it"},
    {"zero_optimization.memory_efficient_linear", kNone, kPytorchHooks},
    {"zero_optimization.override_module_apply", kNone, kPytorchHooks},
    {"zero_optimization.pipeline_loading_checkpoint", kNone, kPytorchHooks},
    {"zero_optimization.log_trace_cache_warnings", kNone, kPytorchHooks},
    {"zero_optimization.enable_sanity_checks", kNone, kPytorchHooks},
    {"zero_optimization.module_granularity_threshold", kNone, kPytorchHooks},
    {"zero_optimization.stage3_module_granularity_threshold", kNone, kPytorchHooks},
    {"bf16.immediate_grad_update", kNone, "zeroth updates the weights once per step, from fp32 master weights"},
    {"bf16.check_grad_overflow", kNone, "zeroth always checks the gradients for Inf/NaN and skips such steps"},
    {"fp16.fused_mode", kNone, "zeroth's optimizer step is always one fused pass"},
    {"fp16.auto_cast", kNone,
     "it casts floating-point inputs to fp16; a GPT's inputs are token ids, and the model computes in the run's precision throughout"},
    {"optimizer.legacy_fusion", kNone, "zeroth's optimizer step is always one fused pass"},
    {"activation_checkpointing.partition_activations", kNone,
     "it partitions checkpoints across tensor-parallel ranks; zeroth's are each rank's rows with parallel.sequence_parallel, "
     "whole otherwise"},
    {"activation_checkpointing.contiguous_memory_optimization", kNone, "zeroth's model keeps each block's checkpoint in its own slot"},
    {"activation_checkpointing.number_checkpoints", kNone, "zeroth's model keeps each block's checkpoint in its own slot"},
    {"activation_checkpointing.synchronize_checkpoint_boundary", kNone,
     "zeroth's streams order the recomputation; there is nothing to synchronize"},
    {"activation_checkpointing.profile", kNone, "wall_clock_breakdown times the forward and backward passes"},

    // ---- DeepSpeed features zeroth does not have
    {"prescale_gradients", kUnsupported, "divides gradients before the reduction instead of after", is_false},
    {"gradient_predivide_factor", kUnsupported, "divides gradients by a factor before the reduction",
     [](const json& v) { return v.is_null() || (v.is_number() && v.get<double>() == 1.0); }},
    {"sparse_gradients", kUnsupported, "reduces embedding gradients as sparse CSR tensors", is_false},
    {"gradient_allreduce_op", kUnsupported, "\"sum\" adds the ranks' gradients instead of averaging them", mean},
    {"managed_gradient_accumulation", kUnsupported, "false lets the training script own the accumulation boundary",
     [](const json& v) { return v.is_null() || is_true(v); }},
    {"graph_harvesting", kUnsupported, "captures the optimizer's kernels as CUDA graphs", is_false},
    {"log_level", kUnsupported, "sets DeepSpeed's Python log level; zeroth's is the ZEROTH_LOG_LEVEL variable", is_null},
    {"amp", kUnsupported, "NVIDIA Apex automatic mixed precision; use the bf16 or fp16 section", disabled},
    {"torch_autocast", kUnsupported, "runs the forward under torch.autocast; the bf16 and fp16 sections set zeroth's precision",
     disabled},
    {"sparse_attention", kUnsupported, "block-sparse attention layouts for DeepSpeed's SparseSelfAttention modules", disabled},
    {"progressive_layer_drop", kUnsupported, "skips transformer layers stochastically during training", disabled},
    {"eigenvalue", kUnsupported, "eigenvalue-based quantization schedules", disabled},
    {"quantize_training", kUnsupported, "quantizes weights during training", disabled},
    {"compression_training", kUnsupported, "quantization and pruning during training", disabled},
    {"elasticity", kUnsupported, "chooses a batch size that works across GPU counts", disabled},
    {"autotuning", kUnsupported, "runs trial jobs to choose the micro-batch size and ZeRO stage", disabled},
    {"curriculum_learning", kUnsupported, "changes the sequence length or data order over training", disabled},
    {"data_efficiency", kUnsupported, "data sampling, curriculum and random layerwise token dropping", disabled},
    {"hybrid_engine", kUnsupported, "switches a model between training and inference kernels (RLHF)", disabled},
    {"weight_quantization", kUnsupported, "quantized weights at initialization (ZeRO-Inference)", is_null},
    {"compile", kUnsupported, "DeepCompile / torch.compile passes", disabled},
    {"tensor_parallel", kUnsupported,
     "AutoTP: tensor parallelism of Hugging Face models; zeroth splits its GPT over parallel.tensor ranks (Megatron-LM's split)",
     disabled},
    {"expert_parallel", kUnsupported, "expert parallelism for mixture-of-experts models", disabled},
    {"sequence_parallel_size", kUnsupported, "Ulysses sequence parallelism", at_most_one},
    {"nebula", kUnsupported, "Azure Nebula's checkpoint engine", disabled},
    {"datastates_ckpt", kUnsupported, "the DataStates asynchronous checkpoint engine", is_null},
    {"wandb", kUnsupported, kNoNetworkMonitor, disabled},
    {"comet", kUnsupported, kNoNetworkMonitor, disabled},
    {"trackio", kUnsupported, kNoNetworkMonitor, disabled},
    {"flops_profiler", kUnsupported, "profiles FLOPs and latency per module", disabled},
    {"comms_logger", kUnsupported, "logs every collective with its size and time", disabled},
    {"zero_optimization.zero_hpz_partition_size", kUnsupported,
     "ZeRO++ hierarchical partitioning: a secondary parameter copy per node", at_most_one},
    {"zero_optimization.zero_quantized_weights", kUnsupported, "ZeRO++ all-gathers weights quantized to int8", is_false},
    {"zero_optimization.zero_quantized_gradients", kUnsupported, "ZeRO++ reduces gradients quantized to int4", is_false},
    {"zero_optimization.zero_quantized_nontrainable_weights", kUnsupported, "keeps frozen weights quantized", is_false},
    {"zero_optimization.zeropp_loco_param", kUnsupported, "LoCo error feedback for ZeRO++ quantized gradients", is_null},
    {"zero_optimization.mics_shard_size", kUnsupported, "MiCS: shards over a subgroup of ranks and replicates across subgroups",
     negative},
    {"zero_optimization.mics_hierarchical_params_gather", kUnsupported, "MiCS's hierarchical parameter all-gather", is_false},
    {"zero_optimization.legacy_stage1", kUnsupported, "DeepSpeed's old stage 1 (DeepSpeed itself refuses it)", is_false},
    {"zero_optimization.zenflow", kUnsupported, "ZenFlow: stall-free updates of offloaded optimizer state", is_null},
    {"zero_optimization.stage3_model_persistence_threshold", kUnsupported, "caps the total size of persistent parameters", unbounded},
    {"zero_optimization.model_persistence_threshold", kUnsupported, "caps the total size of persistent parameters", unbounded},
    {"zero_optimization.stage3_allgather_sequential", kUnsupported, "fetches parameters one at a time", is_false},
    {"zero_optimization.allgather_sequential", kUnsupported, "fetches parameters one at a time", is_false},
    {"zero_optimization.stage3_partition_stream_chunk_size", kUnsupported, "partitions parameters in chunks on a side stream",
     is_zero},
    {"zero_optimization.save_muon_momentum_buffer_in_memory", kUnsupported, "keeps Muon's momentum buffer in memory", is_false},
    {"zero_optimization.leaf_module", kUnsupported, "treats listed PyTorch modules as leaves when fetching", is_null},
    {"bf16.bf16_master_weights_and_grads", kUnsupported,
     "keeps master weights and gradients in bf16; zeroth keeps fp32 master weights", is_false},
    {"bf16.bf16_optimizer_states", kUnsupported, "keeps optimizer state in bf16; zeroth keeps it in fp32", is_false},

    // ---- checkpoints: zeroth's own (run.checkpoint_dir, --resume) need none of these
    {"checkpoint", kUnsupported,
     "checkpoint tag validation, universal checkpoint conversion and node-local writers; zeroth's checkpoints have no tags and load "
     "at any world size as they are (run.checkpoint_dir, zeroth train --resume)",
     disabled},
    {"zero_optimization.load_from_fp32_weights", kUnsupported,
     "loads master weights from the 16-bit copy in a checkpoint; zeroth's checkpoints always hold the fp32 master weights",
     [](const json& v) { return v.is_null() || is_true(v); }},
};

std::string full_path(std::string_view section, const std::string& key) {
  return section.empty() ? key : std::string(section) + "." + key;
}

// bfloat16 is DeepSpeed's old name of the bf16 section; the table says bf16.
std::string_view table_section(std::string_view section) { return section == "bfloat16" ? "bf16" : section; }

bool in_table(std::string_view section, const std::string& key) {
  const std::string entry = full_path(table_section(section), key);
  return std::any_of(std::begin(kKeys), std::end(kKeys), [&](const DeepSpeedKey& k) { return k.path == entry; });
}

}  // namespace

std::span<const DeepSpeedKey> deepspeed_keys() { return kKeys; }

bool handle_deepspeed_key(std::string_view section, const std::string& key, const nlohmann::json& value,
                          std::vector<std::string>* no_effect) {
  const std::string path = full_path(section, key), entry = full_path(table_section(section), key);
  for (const auto& k : kKeys) {
    if (k.path != entry) continue;
    switch (k.treatment) {
      case KeyTreatment::no_effect:
        if (no_effect != nullptr) no_effect->push_back(path + ": " + std::string(k.text));
        return true;
      case KeyTreatment::unsupported:
        if (k.inert != nullptr && k.inert(value)) return true;
        ZEROTH_KEY_ERROR("{} = {} is a DeepSpeed feature zeroth does not support ({}); remove it{}", path, value.dump(), k.text,
                         value.is_object() && value.contains("enabled") ? " or set \"enabled\": false" : "");
        return true;
      case KeyTreatment::later:
        if (k.inert != nullptr && k.inert(value)) return true;
        ZEROTH_KEY_ERROR("{} = {} asks for {}, which zeroth does not have yet; remove it", path, value.dump(), k.text);
        return true;
    }
  }
  return false;
}

json without_deepspeed_extras(const json& section, std::string_view path, std::span<const std::string_view> own,
                              std::vector<std::string>& no_effect, UnknownKeys unknown, AutoValues autos) {
  if (!section.is_object()) return section;
  json rest = json::object();
  for (const auto& [key, v] : section.items()) {
    const bool known_default = autos == AutoValues::mean_default && is_auto(v);
    if (std::find(own.begin(), own.end(), key) != own.end()) {
      if (!known_default) rest[key] = v;
      continue;
    }
    if (known_default && in_table(path, key)) continue;
    if (handle_deepspeed_key(path, key, v, &no_effect)) continue;
    std::vector<std::string_view> known(own.begin(), own.end());
    for (auto k : deepspeed_key_names(path)) known.push_back(k);
    const std::string at = full_path(path, key);
    if (unknown == UnknownKeys::ignore_unless_typo && closest_match(key, known).empty()) {
      no_effect.push_back(at + ": neither DeepSpeed nor zeroth reads it; ignored, as DeepSpeed ignores it");
      continue;
    }
    ZEROTH_KEY_ERROR("{} is not a known key{}{}", at, did_you_mean(key, known),
                     unknown == UnknownKeys::ignore_unless_typo
                         ? " (DeepSpeed ignores keys it does not read here; zeroth refuses one this close to a known key, so a typo "
                           "cannot pass unnoticed)"
                         : "");
  }
  return rest;
}

std::vector<std::string_view> deepspeed_key_names(std::string_view section) {
  section = table_section(section);
  std::vector<std::string_view> out;
  for (const auto& k : kKeys) {
    const std::string_view p = k.path;
    if (section.empty() && p.find('.') == std::string_view::npos) out.push_back(p);
    if (!section.empty() && p.size() > section.size() + 1 && p.starts_with(section) && p[section.size()] == '.') {
      out.push_back(p.substr(section.size() + 1));
    }
  }
  return out;
}

}  // namespace zeroth
