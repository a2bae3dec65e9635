// What the engine needs to know about a run: the ZeRO section in DeepSpeed's names and
// defaults, precision, accumulation, clipping, optimizer and schedule. The training config
// (JSON, "auto" resolution, batch rules) fills this in; tests and benches build it directly.
#pragma once

#include <cstddef>  // size_t
#include <cstdint>  // int64_t, uint64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

#include "core/dtype.h"         // DType
#include "models/block_api.h"   // BlockSpec, ParamSpec, ParamRole
#include "optim/loss_scaler.h"  // LossScalerConfig
#include "optim/lr_schedule.h"  // LrSchedule
#include "optim/optimizer.h"    // OptimizerParams

namespace zeroth {

// Where offloaded state lives: DeepSpeed's offload_optimizer / offload_param "device".
enum class OffloadDevice : uint8_t { none, cpu, nvme };
std::string_view offload_device_name(OffloadDevice device);

// DeepSpeed's `zero_optimization.offload_optimizer` (and `offload_param`) section, in its names
// and defaults; the legacy `cpu_offload`, `cpu_offload_params` and `cpu_offload_use_pin_memory`
// keys map onto it.
struct OffloadConfig {
  OffloadDevice device = OffloadDevice::none;
  std::string nvme_path;    // folder for the swap files (device nvme)
  bool pin_memory = false;  // host buffers page-locked (cudaHostAlloc with CUDA, mlock without)
  // offload_optimizer: read the next sub-group's state while one updates, write the previous one
  // back meanwhile. DeepSpeed's defaults are false; zeroth's are true (the same bytes, overlapped).
  bool pipeline_read = true, pipeline_write = true;
  // offload_optimizer on nvme: each sub-group is swapped in, updated and written back during the
  // backward pass, as soon as its gradients are final, speculating that the step is neither
  // clipped nor skipped; the step commits, or redoes the sub-groups when it is (zeroth's key).
  // Master weights and moments keep two copies in their swap files (the step's and the last).
  bool overlap_backward = true;
  // offload_optimizer: ZeRO-Offload's delayed parameter update (zeroth's keys; DeepSpeed has none).
  // After `delayed_update_warmup` updates applied serially, each step's update (swap-in, update,
  // write-back) runs in the background under the next step's forward and backward, which still see
  // the weights before it; its parameters are published at that next step. The forward's weights
  // are one update behind; anything that reads the state between steps (a checkpoint, an export)
  // publishes the pending update first. Replaces overlap_backward.
  bool delayed_update = false;
  uint64_t delayed_update_warmup = 10;
  // offload_param: the swap buffers (count, elements each) and the elements kept in host memory.
  uint64_t buffer_count = 0, buffer_size = 100'000'000, max_in_cpu = 1'000'000'000;
  // offload_optimizer: the fraction of the shard offloaded (and updated on the host); the rest,
  // whole reduce buckets, stays on the device (DeepSpeed's partial offload, ZeRO-Offload++).
  double ratio = 1.0;
  std::vector<std::string> no_effect;
  bool enabled() const { return device != OffloadDevice::none; }

  // DeepSpeed's defaults of offload_optimizer, or with `params` of offload_param.
  static OffloadConfig defaults(bool params) {
    OffloadConfig o;
    o.buffer_count = params ? 5 : 4;
    return o;
  }
  // `where` names the section in messages; `params`: offload_param's keys and defaults.
  static OffloadConfig from_deepspeed(const nlohmann::json& section, std::string_view where, bool params);
};

// DeepSpeed's top-level `aio` section: how swap files are read and written (offload/aio.h).
struct AioConfig {
  uint64_t block_size = 1'048'576;  // bytes per request piece
  uint64_t queue_depth = 8;         // pieces in flight per ring
  uint64_t threads = 1;             // intra_op_parallelism (thread_count): rings and their threads
  bool single_submit = false;       // DeepSpeed's submit-one-at-a-time mode: accepted, pieces are still batched
  bool overlap_events = true;       // accepted: completions are always reaped while others are in flight
  std::vector<std::string> no_effect;

  static AioConfig from_deepspeed(const nlohmann::json& section);
};

// DeepSpeed's `zero_optimization` section. Sizes are in elements, as in DeepSpeed.
struct ZeroConfig {
  int stage = 0;
  // 0, or anything below a block's size, makes one bucket per block (DeepSpeed then reduces each
  // gradient on its own).
  uint64_t reduce_bucket_size = 500'000'000;
  uint64_t allgather_bucket_size = 500'000'000;
  bool overlap_comm = false;  // DeepSpeed turns it on for stage 3 when the key is absent
  uint64_t stage3_prefetch_bucket_size = 50'000'000;
  uint64_t stage3_max_live_parameters = 1'000'000'000;
  uint64_t stage3_max_reuse_distance = 1'000'000'000;
  uint64_t stage3_param_persistence_threshold = 100'000;
  // The optimizer steps the shard in sub-groups of at most this many elements (the unit offload
  // swaps; DeepSpeed's default).
  uint64_t sub_group_size = 1'000'000'000;
  // The weights a run saves (model.safetensors) in the compute dtype (bf16/f16) instead of the
  // fp32 master weights (DeepSpeed's stage3_gather_16bit_weights_on_model_save; false there too).
  bool gather_16bit_weights_on_model_save = false;
  OffloadConfig offload_optimizer = OffloadConfig::defaults(false), offload_param = OffloadConfig::defaults(true);
  // Keys present that have no effect in zeroth ("path: why"), for the log at start.
  std::vector<std::string> no_effect;

  // Unknown keys are ConfigErrors with a suggestion; DeepSpeed's other keys are handled by the
  // table in engine/config/deepspeed_keys.h; "auto" must have been resolved by the caller.
  static ZeroConfig from_deepspeed(const nlohmann::json& section);
  void validate() const;
};

// Which parameters the optimizer's weight decay skips. Each entry is a role (`bias`, `norm`,
// `embedding`, `weight`: what the model says each parameter is) or a glob over
// "<block>.<parameter>" names (fnmatch, e.g. "h.*.attn.*"). The default is Hugging Face
// Trainer's rule: no decay on biases and LayerNorm parameters; optimizer.params.weight_decay
// applies to the rest.
struct WeightDecayRule {
  std::vector<std::string> exclude = {"bias", "norm"};

  bool decays(const std::string& block, const ParamSpec& param) const;
  // A glob that matches no parameter is a ConfigError (a typo would silently decay everything).
  void check(const std::vector<BlockSpec>& specs) const;
};

struct EngineConfig {
  ZeroConfig zero;
  DType compute_dtype = DType::f32;        // bf16.enabled -> bf16, fp16.enabled -> f16
  DType communication_dtype = DType::f32;  // gradient reduction (communication_data_type)
  LossScalerConfig loss_scaler;            // used when compute_dtype is f16
  int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 0.0;  // 0: off
  OptimizerParams optimizer;
  WeightDecayRule no_weight_decay;
  LrSchedule schedule;  // base_lr should equal optimizer.lr
  uint64_t seed = 1234;
  // DeepSpeed's wall_clock_breakdown: step() synchronizes to time its parts (StepResult).
  bool time_breakdown = false;
  AioConfig aio;
  // Bytes of host memory (pinned and pageable) the engine may hold for state it places there;
  // 0: unlimited. The device's own budget is the device's.
  size_t host_memory = 0;
  // What the budgets are called where the user sets them, for the messages that refuse a plan.
  std::string device_budget_name = "the device's memory budget", host_budget_name = "the host memory budget";
  // Parameters are padded so each rank's shard starts on this many elements (256 bytes of f32).
  uint64_t alignment = 64;

  void validate() const;
};

}  // namespace zeroth
