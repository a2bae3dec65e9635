// `zeroth estimate` without a config: a parameter count, a preset or a GPT's shape (tools/cli/estimate.h).
#include <algorithm>  // std::any_of
#include <cstdio>     // std::printf
#include <memory>     // std::make_shared
#include <string>     // std::string
#include <utility>    // std::pair
#include <vector>     // std::vector

#include <CLI/CLI.hpp>        // CLI::App
#include <fmt/format.h>       // fmt::format
#include <fmt/ranges.h>       // fmt::join
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"            // ConfigError
#include "core/memory.h"           // format_bytes, parse_bytes
#include "engine/plan/estimate.h"  // estimate, MemoryNeed
#include "planner/model_states.h"  // zero_model_states, deepspeed_estimates
#include "planner/gpt_layout.h"    // layout_memory
#include "planner/planner.h"       // Cluster
#include "engine/plan/plan.h"      // make_plan
#include "models/decoder/gpt.h"    // Gpt
#include "tools/cli/commands.h"
#include "tools/cli/estimate.h"
#include "tools/cli/options.h"
#include "train/config/train_config.h"  // TrainConfig
#include "train/trainer.h"              // largest_stage

namespace zeroth::tools {
namespace estimate_model {

uint64_t count(const std::string& text, const char* flag) { return static_cast<uint64_t>(parse_count(text, flag) + 0.5); }

// --params: stage x placement, per GPU, with the paper's formulas (engine/plan/estimate.h); no model,
// so no activations or buffers (--config counts those).
// --deepspeed-compatible: DeepSpeed's estimate_zero2/3_model_states_mem_needs_all_cold, its rows
// and its format (its "GB" are GiB, two decimals).
int run_deepspeed(const EstimateOptions& o, uint64_t params, uint64_t largest) {
  const auto rows = deepspeed_estimates(params, largest, o.gpus_per_node, o.nodes);
  if (o.json) {
    nlohmann::json out = {{"params", params},
                          {"largest_layer", largest},
                          {"gpus_per_node", o.gpus_per_node},
                          {"nodes", o.nodes},
                          {"rows", nlohmann::json::array()}};
    for (const auto& r : rows) {
      out["rows"].push_back({{"stage", r.stage},
                             {"offload_optimizer", r.offload_optimizer ? "cpu" : "none"},
                             {"offload_param", r.offload_param ? "cpu" : "none"},
                             {"zero_init", r.zero_init < 0 ? nlohmann::json(nullptr) : nlohmann::json(r.zero_init == 1)},
                             {"gpu_bytes", r.gpu_bytes},
                             {"cpu_bytes", r.cpu_bytes}});
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  const char* nodes = o.nodes > 1 ? "nodes" : "node";
  const char* gpus = o.gpus_per_node > 1 ? "GPUs" : "GPU";
  for (int stage : {2, 3}) {
    std::printf("ZeRO-%d (DeepSpeed's estimate_zero%d_model_states_mem_needs_all_cold):\n", stage, stage);
    std::printf("Estimated memory needed for params, optim states and gradients for a:\nHW: Setup with %d %s, %d %s per node.\n",
                o.nodes, nodes, o.gpus_per_node, gpus);
    if (stage == 2) {
      std::printf("SW: Model with %lluM total params.\n", static_cast<unsigned long long>(params / 1000000));
    } else {
      std::printf("SW: Model with %lluM total params, %lluM largest layer params.\n",
                  static_cast<unsigned long long>(params / 1000000), static_cast<unsigned long long>(largest / 1000000));
    }
    std::printf("  per CPU  |  per GPU |   Options\n");
    for (const auto& r : rows) {
      if (r.stage != stage) continue;
      const std::string options = stage == 2 ? fmt::format("offload_optimizer={}", r.offload_optimizer ? "cpu " : "none")
                                             : fmt::format("offload_param={}, offload_optimizer={}, zero_init={}",
                                                           r.offload_param ? "cpu " : "none", r.offload_optimizer ? "cpu " : "none",
                                                           r.zero_init);
      std::printf(" %7.2fGB | %6.2fGB | %s\n", static_cast<double>(r.cpu_bytes) / 1073741824.0,
                  static_cast<double>(r.gpu_bytes) / 1073741824.0, options.c_str());
    }
    std::printf("\n");
  }
  std::printf("DeepSpeed's numbers as its code computes them (its \"GB\" are 2^30 bytes; per CPU is per node). Since DeepSpeed "
              "0.14.3 ZeRO-2 without offload is 2P + 18P/N on the GPU; its documentation still shows 4P + 16P/N.%s\n",
              largest == 0 ? " ZeRO-3 needs --largest-layer for its largest-layer term." : "");
  return 0;
}

// --device-memory or --host-memory for a cluster's GPUs and nodes: `zeroth plan`'s defaults (a DGX
// A100 80GB node's) unless given; 0 is unlimited.
size_t cluster_budget(const std::string& given, uint64_t plan_default) { return given.empty() ? plan_default : parse_bytes(given); }

// "device 80.00 GiB per GPU, host 1.00 TiB per node (zeroth plan's defaults, ...)": the budgets and
// where the figures come from.
std::string budgets_text(size_t device, const std::string& device_given, size_t host, const std::string& host_given) {
  auto one = [](size_t b) { return b ? format_bytes(b) : std::string("unlimited"); };
  const char* from = device_given.empty() && host_given.empty() ? "zeroth plan's defaults, a DGX A100 80GB node's; "
                     : device_given.empty()                     ? "the device's is zeroth plan's default; "
                     : host_given.empty()                       ? "the host's is zeroth plan's default; "
                                                                : "";
  return fmt::format("device {} per GPU, host {} per node ({}--device-memory, --host-memory; 0 is unlimited)", one(device), one(host),
                     from);
}

// A preset's parameter count and its largest block (ZeRO-3's largest-layer term).
std::pair<uint64_t, uint64_t> preset_counts(const std::string& name) {
  uint64_t total = 0, largest = 0;
  for (const auto& b : Gpt::block_specs(checked_preset(name))) {
    uint64_t n = 0;
    for (const auto& p : b.params) n += p.numel();
    total += n, largest = std::max(largest, n);
  }
  return {total, largest};
}

}  // namespace estimate_model

int estimate_params(const EstimateOptions& o) {
  using namespace estimate_model;
  const auto [preset_params, preset_largest] = o.model.empty() ? std::pair<uint64_t, uint64_t>{0, 0} : preset_counts(o.model);
  const uint64_t params = o.model.empty() ? count(o.params, "--params") : preset_params;
  const uint64_t largest = !o.largest_layer.empty() ? count(o.largest_layer, "--largest-layer") : preset_largest;
  if (o.deepspeed_compatible) return run_deepspeed(o, params, largest);
  const uint64_t gpus = static_cast<uint64_t>(o.gpus_per_node) * static_cast<uint64_t>(o.nodes);
  const size_t device_budget = cluster_budget(o.device_memory, Cluster{}.device_memory);
  const size_t node_host_budget = cluster_budget(o.host_memory, Cluster{}.host_memory);
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json) {
    std::printf("zeroth estimate: %s%s parameters%s on %llu GPU%s (%d per node x %d nodes); model states (the ZeRO paper's "
                "count: fp16/bf16 parameters and gradients, fp32 master weights and Adam moments), per GPU and per node\n",
                o.model.empty() ? "" : (o.model + ", ").c_str(), fmt::format("{}", params).c_str(),
                largest > 0 ? fmt::format(", largest layer {}", largest).c_str() : "", static_cast<unsigned long long>(gpus),
                gpus == 1 ? "" : "s", o.gpus_per_node, o.nodes);
    std::printf("%-5s %-9s %-9s %14s %16s %16s  %s\n", "stage", "optimizer", "params", "device/GPU", "host/node", "nvme/node", "fits");
  }
  if (o.context > 1 && !o.json) {
    std::printf("(--context: zeroth runs ring attention on the cpu device only; these rows count its memory against the budget "
                "given)\n");
  }
  for (int stage = 0; stage <= 3; ++stage) {
    for (OffloadDevice opt : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}) {
      for (OffloadDevice par : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}) {
        if ((stage == 0 && opt != OffloadDevice::none) || (stage != 3 && par != OffloadDevice::none)) continue;
        if (par != OffloadDevice::none && opt == OffloadDevice::none) continue;
        const ModelStates m = zero_model_states(params, stage, gpus, opt, par, largest);
        const uint64_t host_node = m.host * static_cast<uint64_t>(o.gpus_per_node),
                       nvme_node = m.nvme * static_cast<uint64_t>(o.gpus_per_node);
        const bool fits = (device_budget == 0 || m.device <= device_budget) &&
                          (node_host_budget == 0 || host_node <= node_host_budget);
        rows.push_back({{"stage", stage},
                        {"offload_optimizer", offload_device_name(opt)},
                        {"offload_param", offload_device_name(par)},
                        {"model_states_bytes_per_gpu", m.device},
                        {"device_bytes", m.device},
                        {"host_bytes_per_node", host_node},
                        {"nvme_bytes", m.nvme},
                        {"nvme_bytes_per_node", nvme_node},
                        {"fits", fits}});
        if (!o.json) {
          std::printf("%-5d %-9s %-9s %14s %16s %16s  %s\n", stage, offload_device_name(opt).data(), offload_device_name(par).data(),
                      format_bytes(m.device).c_str(), format_bytes(host_node).c_str(), format_bytes(nvme_node).c_str(),
                      fits ? "yes" : "no");
        }
      }
    }
  }
  if (o.json) {
    std::printf("%s\n", nlohmann::json{{"params", params},
                                       {"model", o.model},
                                       {"largest_layer", largest},
                                       {"gpus_per_node", o.gpus_per_node},
                                       {"nodes", o.nodes},
                                       {"device_memory", device_budget},
                                       {"host_memory_per_node", node_host_budget},
                                       {"rows", rows}}
                            .dump(2)
                            .c_str());
  } else {
    std::printf("sizes in binary units (1 GiB = 2^30 bytes; the ZeRO paper's GB are 10^9: its 120 GB are 111.76 GiB)\n");
    std::printf("budgets: %s. Model states only: activations, communication buckets and swap buffers depend on the model's shape "
                "and the config (give %s, or --config, for them)%s\n",
                budgets_text(device_budget, o.device_memory, node_host_budget, o.host_memory).c_str(),
                o.model.empty() ? "--layers, --hidden and --heads" : "a layout option such as --seq or --tp with --model",
                largest == 0 ? "; with parameters offloaded, the largest layer's working set needs --largest-layer" : "");
  }
  return 0;
}

// --layers/--hidden/--heads: the model's shape on gpus_per_node x nodes GPUs in dp x tp x pp, for
// every stage and placement, and each with no, selective and full recomputation
// (planner/gpt_layout.h: ZeRO paper model states, Korthikanti et al. activations).
// Long: the shape's checks, then a row per stage and placement with its three recomputation kinds, printed and kept for the
// JSON; the closing note needs the scores' extra bytes the rows measured.
int estimate_shape(const EstimateOptions& o, const GptShape& shape) {
  using namespace estimate_model;
  const uint64_t gpus = static_cast<uint64_t>(o.gpus_per_node) * static_cast<uint64_t>(o.nodes);
  if (o.tp == 0 || o.pp == 0 || gpus % (o.tp * o.pp) != 0)
    ZEROTH_THROW(InvalidArgument, "{} GPUs do not divide into --tp {} x --pp {} (the data-parallel degree is what is left)", gpus,
                 o.tp, o.pp);
  if (shape.heads % o.tp != 0) ZEROTH_THROW(InvalidArgument, "--tp {} does not divide the {} heads", o.tp, shape.heads);
  if (shape.kv_heads % o.tp != 0)
    ZEROTH_THROW(InvalidArgument, "--tp {} does not divide the {} key/value heads (as Megatron-LM, zeroth does not replicate them)",
                 o.tp, shape.kv_heads);
  if (o.pp > shape.layers) ZEROTH_THROW(InvalidArgument, "--pp {} is more stages than the {} layers", o.pp, shape.layers);
  if (o.tp > static_cast<uint64_t>(o.gpus_per_node))
    ZEROTH_THROW(InvalidArgument,
                 "--tp {} spans more than a node's {} GPUs: tensor parallelism stays inside a node (raise --gpus-per-node)", o.tp,
                 o.gpus_per_node);
  if (o.micro_batches > 1 && o.pp == 1)
    ZEROTH_THROW(InvalidArgument, "--micro-batches counts a pipeline's micro-batches in flight: give it with --pp above 1 (without a "
                                  "pipeline, accumulation does not change memory)");
  if (o.sequence_parallel && o.tp == 1)
    ZEROTH_THROW(InvalidArgument, "--sequence-parallel splits along tensor-parallel ranks: give --tp above 1");
  if (o.gpipe && o.pp == 1) ZEROTH_THROW(InvalidArgument, "--gpipe is a pipeline schedule: give --pp above 1");
  const uint64_t dp = gpus / (o.tp * o.pp);
  if (o.sequence > 1) {
    const uint64_t heads = shape.heads / o.tp, kv = (shape.kv_heads > 0 ? shape.kv_heads : shape.heads) / o.tp;
    if (dp % o.sequence != 0)
      ZEROTH_THROW(InvalidArgument, "--sequence {} must divide the {} data-parallel ranks (GPUs over tp x pp)", o.sequence, dp);
    if (shape.seq_len % o.sequence != 0)
      ZEROTH_THROW(InvalidArgument, "--sequence {} must divide the window, --seq {}", o.sequence, shape.seq_len);
    if (heads % o.sequence != 0 || (kv % o.sequence != 0 && o.sequence % kv != 0)) {
      ZEROTH_THROW(InvalidArgument,
                   "--sequence {} must divide the {} heads per tensor-parallel rank, and divide or be a multiple of its {} key/value "
                   "heads",
                   o.sequence, heads, kv);
    }
  }
  if (o.context > 1) {
    if (o.sequence > 1)
      ZEROTH_THROW(InvalidArgument, "--sequence {} and --context {}: each sample's positions split one way at a time", o.sequence,
                   o.context);
    if (dp % o.context != 0)
      ZEROTH_THROW(InvalidArgument, "--context {} must divide the {} data-parallel ranks (GPUs over tp x pp)", o.context, dp);
    if (shape.seq_len % (2 * o.context) != 0)
      ZEROTH_THROW(InvalidArgument, "--context {} cuts the window into {} equal chunks: --seq {} must be a multiple of it", o.context,
                   2 * o.context, shape.seq_len);
  }
  if (o.pp > 1 && o.host_checkpoints)
    ZEROTH_THROW(InvalidArgument, "--host-checkpoints keeps a whole model's block inputs in host memory: not with --pp above 1");
  const size_t device_budget = cluster_budget(o.device_memory, Cluster{}.device_memory);
  const size_t node_host_budget = cluster_budget(o.host_memory, Cluster{}.host_memory);
  const uint64_t runtime = o.runtime_memory.empty() ? kDeviceRuntimeBytes : parse_bytes(o.runtime_memory);
  const Checkpointing kinds[] = {Checkpointing::none, Checkpointing::selective, Checkpointing::full};
  uint64_t scores_extra = 0;  // what attention that keeps its s x s scores would add, without recomputation
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json) {
    std::printf("zeroth estimate: %s of %s parameters (%s) on %llu GPUs (%d per node x %d nodes) as dp %llu x tp %llu x pp %llu, "
                "micro-batch %llu%s%s, per GPU (the pipeline stage that holds the most)\n",
                o.model.empty() ? "GPT" : o.model.c_str(), fmt::format("{}", shape.params()).c_str(), shape.describe().c_str(),
                static_cast<unsigned long long>(gpus), o.gpus_per_node, o.nodes, static_cast<unsigned long long>(gpus / (o.tp * o.pp)),
                static_cast<unsigned long long>(o.tp), static_cast<unsigned long long>(o.pp),
                static_cast<unsigned long long>(o.micro_batch),
                o.pp > 1 ? fmt::format(" x {} ({})", o.micro_batches, o.gpipe ? "GPipe" : "1F1B").c_str() : "",
                fmt::format("{}{}{}{}", o.sequence > 1 ? fmt::format(", Ulysses over {} ranks", o.sequence) : "",
                            o.context > 1 ? fmt::format(", ring attention over {} ranks", o.context) : "",
                            o.tiled_mlp ? ", tiled MLP" : "",
                            o.host_checkpoints ? ", full recomputation's checkpoints in host memory" : "")
                    .c_str());
    std::printf("%-5s %-9s %-9s %13s %11s %11s %11s %11s %11s %11s %11s %12s %12s  %s\n", "stage", "optimizer", "params",
                "model states", "acts none", "acts sel.", "acts full", "buffers", "device none", "device sel.", "device full",
                "host/node", "nvme/node", "fits none/sel./full");
  }
  for (int stage = 0; stage <= 3; ++stage) {
    for (OffloadDevice opt : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}) {
      for (OffloadDevice par : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}) {
        if ((stage == 0 && opt != OffloadDevice::none) || (stage != 3 && par != OffloadDevice::none)) continue;
        if (par != OffloadDevice::none && opt == OffloadDevice::none) continue;
        Layout l;
        l.dp = gpus / (o.tp * o.pp), l.tp = o.tp, l.pp = o.pp, l.micro_batch = o.micro_batch, l.micro_batches = o.micro_batches;
        l.stage = stage, l.offload_optimizer = opt, l.offload_param = par, l.sequence_parallel = o.sequence_parallel;
        l.sq = o.sequence, l.cp = o.context, l.tiled_mlp = o.tiled_mlp, l.host_checkpoints = o.host_checkpoints;
        l.schedule = o.gpipe ? PipeKind::gpipe : PipeKind::one_f_one_b;
        nlohmann::json acts = nlohmann::json::object(), device = nlohmann::json::object(), fits = nlohmann::json::object();
        LayoutMemory none, full;
        std::string fits_text;
        for (Checkpointing k : kinds) {
          l.checkpointing = k;
          const LayoutMemory m = layout_memory(shape, l, {}, runtime);
          if (k == Checkpointing::none) none = m;
          if (k == Checkpointing::full) full = m;
          const bool ok = (device_budget == 0 || m.device <= device_budget) &&
                          (node_host_budget == 0 || m.host * static_cast<uint64_t>(o.gpus_per_node) <= node_host_budget);
          const std::string name(checkpointing_name(k));
          acts[name] = m.activations, device[name] = m.device, fits[name] = ok;
          fits_text += std::string(fits_text.empty() ? "" : "/") + (ok ? "yes" : "no");
        }
        // The labelled alternative: attention that keeps its s x s softmax tensors, as Korthikanti et
        // al. count (zeroth's blocked attention keeps each row's log-sum-exp instead).
        Layout with_scores = l;
        with_scores.checkpointing = Checkpointing::none, with_scores.attention_scores = true;
        const LayoutMemory scores = layout_memory(shape, with_scores, {}, runtime);
        scores_extra = scores.activations - none.activations;
        // Host checkpoints are full recomputation's: its row's host memory then.
        const uint64_t host_node = (o.host_checkpoints ? full : none).host * static_cast<uint64_t>(o.gpus_per_node),
                       nvme_node = none.nvme * static_cast<uint64_t>(o.gpus_per_node);
        rows.push_back({{"stage", stage},
                        {"offload_optimizer", offload_device_name(opt)},
                        {"offload_param", offload_device_name(par)},
                        {"model_states_bytes_per_gpu", none.model_states},
                        {"device_bytes", none.device},
                        {"activations_bytes", acts},
                        {"activations_bytes_if_attention_keeps_scores", scores.activations},
                        {"device_bytes_by_checkpointing", device},
                        {"buffers_bytes", none.buffers},
                        {"allowance_bytes", none.allowance},
                        {"host_bytes_per_node", host_node},
                        {"nvme_bytes", none.nvme},
                        {"nvme_bytes_per_node", nvme_node},
                        {"fits", fits["none"]},
                        {"fits_by_checkpointing", fits}});
        if (!o.json) {
          std::printf("%-5d %-9s %-9s %13s %11s %11s %11s %11s %11s %11s %11s %12s %12s  %s\n", stage, offload_device_name(opt).data(),
                      offload_device_name(par).data(), format_bytes(none.model_states).c_str(),
                      format_bytes(acts["none"].get<uint64_t>()).c_str(), format_bytes(acts["selective"].get<uint64_t>()).c_str(),
                      format_bytes(acts["full"].get<uint64_t>()).c_str(), format_bytes(none.buffers).c_str(),
                      format_bytes(none.device).c_str(), format_bytes(device["selective"].get<uint64_t>()).c_str(),
                      format_bytes(device["full"].get<uint64_t>()).c_str(), format_bytes(host_node).c_str(),
                      format_bytes(nvme_node).c_str(), fits_text.c_str());
        }
      }
    }
  }
  if (o.json) {
    std::printf("%s\n", nlohmann::json{{"params", shape.params()},
                                       {"layers", shape.layers},
                                       {"hidden", shape.hidden},
                                       {"heads", shape.heads},
                                       {"seq_len", shape.seq_len},
                                       {"vocab", shape.vocab},
                                       {"gpus_per_node", o.gpus_per_node},
                                       {"nodes", o.nodes},
                                       {"dp", gpus / (o.tp * o.pp)},
                                       {"tp", o.tp},
                                       {"pp", o.pp},
                                       {"micro_batch", o.micro_batch},
                                       {"sequence", o.sequence},
                                       {"context", o.context},
                                       {"tiled_mlp", o.tiled_mlp},
                                       {"host_checkpoints", o.host_checkpoints},
                                       {"device_memory", device_budget},
                                       {"host_memory_per_node", node_host_budget},
                                       {"rows", rows}}
                            .dump(2)
                            .c_str());
    return 0;
  }
  std::printf("model states: the ZeRO paper's (2 + 2 + 12 bytes per parameter, partitioned by stage over dp); activations: "
              "Korthikanti et al. 2022 per layer (16-bit, %s without tensor parallelism) as zeroth's attention by blocks holds "
              "them (each row's log-sum-exp, 4 a s b bytes, where attention that keeps its s x s softmax tensors holds %s: "
              "%s more per GPU without recomputation), times the layers of the stage and its micro-batches in flight, with no, "
              "selective and full recomputation (full also holds one layer being recomputed); buffers: reduce bucket 500M "
              "elements, stage 3 a gathered layer and the 50M prefetch bucket; device adds %s for the runtime and 5%% for "
              "fragmentation. budgets: %s\n",
              shape.llama ? "counted as GPT-2's without dropout, s b (12 h + 4 kv + 6 ffn)" : "s b h 34",
              shape.llama ? "2 a s^2 b" : "5 a s^2 b", format_bytes(scores_extra).c_str(), format_bytes(runtime).c_str(),
              budgets_text(device_budget, o.device_memory, node_host_budget, o.host_memory).c_str());
  return 0;
}


}  // namespace zeroth::tools
