// `zeroth estimate --config CONFIG`: what one rank of the config's run holds per tier and tag, for
// every ZeRO stage and offload placement, from the plan the engine itself would build (make_plan)
// and the one estimate its budget check uses (engine/plan/estimate.h) — so the row of the config's own
// choice is what the run is held against at start.
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
#include "tools/cli/options.h"
#include "train/config/train_config.h"  // TrainConfig
#include "train/trainer.h"              // largest_stage

namespace zeroth::tools {
namespace {

struct Options {
  std::string config;
  std::vector<std::string> overrides;
  std::string device_memory, host_memory;  // "" = the config's
  bool json = false;
  // Parameter-count mode (instead of a config): the ZeRO paper's model states per GPU; `model`: a
  // preset's exact count and largest block instead of --params.
  std::string params, largest_layer, model;
  int gpus_per_node = 1, nodes = 1;
  bool deepspeed_compatible = false;  // DeepSpeed's own two tables, with its numbers
  // GPT-dimension mode: the model's shape and its layout over the GPUs.
  GptShape shape{0, 0, 0, 2048, 51200};
  uint64_t micro_batch = 1, micro_batches = 1, tp = 1, pp = 1;
  bool sequence_parallel = false, gpipe = false;
  std::string runtime_memory;
  // --seq, --micro-batch(es), --tp, --pp, ...: with --model, any of them given asks for the
  // preset's layout table (activations too) instead of its model states alone.
  std::vector<const CLI::Option*> layout_options;
  bool layout_given() const {
    return std::any_of(layout_options.begin(), layout_options.end(), [](const CLI::Option* opt) { return opt->count() > 0; });
  }
};

uint64_t count(const std::string& text, const char* flag) { return static_cast<uint64_t>(parse_count(text, flag) + 0.5); }

// --params: stage x placement, per GPU, with the paper's formulas (engine/plan/estimate.h); no model,
// so no activations or buffers (--config counts those).
// --deepspeed-compatible: DeepSpeed's estimate_zero2/3_model_states_mem_needs_all_cold, its rows
// and its format (its "GB" are GiB, two decimals).
int run_deepspeed(const Options& o, uint64_t params, uint64_t largest) {
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

int run_params(const Options& o) {
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
int run_shape(const Options& o, const GptShape& shape) {
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
  const size_t device_budget = cluster_budget(o.device_memory, Cluster{}.device_memory);
  const size_t node_host_budget = cluster_budget(o.host_memory, Cluster{}.host_memory);
  const uint64_t runtime = o.runtime_memory.empty() ? kDeviceRuntimeBytes : parse_bytes(o.runtime_memory);
  const Checkpointing kinds[] = {Checkpointing::none, Checkpointing::selective, Checkpointing::full};
  uint64_t scores_extra = 0;  // what attention that keeps its s x s scores would add, without recomputation
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json) {
    std::printf("zeroth estimate: %s of %s parameters (%s) on %llu GPUs (%d per node x %d nodes) as dp %llu x tp %llu x pp %llu, "
                "micro-batch %llu%s, per GPU (the pipeline stage that holds the most)\n",
                o.model.empty() ? "GPT" : o.model.c_str(), fmt::format("{}", shape.params()).c_str(), shape.describe().c_str(),
                static_cast<unsigned long long>(gpus), o.gpus_per_node, o.nodes, static_cast<unsigned long long>(gpus / (o.tp * o.pp)),
                static_cast<unsigned long long>(o.tp), static_cast<unsigned long long>(o.pp),
                static_cast<unsigned long long>(o.micro_batch),
                o.pp > 1 ? fmt::format(" x {} ({})", o.micro_batches, o.gpipe ? "GPipe" : "1F1B").c_str() : "");
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
        l.schedule = o.gpipe ? PipeKind::gpipe : PipeKind::one_f_one_b;
        nlohmann::json acts = nlohmann::json::object(), device = nlohmann::json::object(), fits = nlohmann::json::object();
        LayoutMemory none;
        std::string fits_text;
        for (Checkpointing k : kinds) {
          l.checkpointing = k;
          const LayoutMemory m = layout_memory(shape, l, {}, runtime);
          if (k == Checkpointing::none) none = m;
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
        const uint64_t host_node = none.host * static_cast<uint64_t>(o.gpus_per_node),
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

struct Row {
  int stage = 0;
  OffloadDevice optimizer = OffloadDevice::none, params = OffloadDevice::none;
  bool chosen = false;  // the config's own stage and placement
  MemoryNeed need;
  std::string refused;  // why this combination is not a valid config ("" when it is)
  std::string assumed;  // a setting the row needed that the config does not give
};


size_t model_states_on_device(const MemoryNeed& n) {
  return at(n.bytes, Tier::device, MemTag::params) + at(n.bytes, Tier::device, MemTag::grads) +
         at(n.bytes, Tier::device, MemTag::optimizer);
}

size_t host_bytes(const MemoryNeed& n) { return n.total(Tier::host) + n.total(Tier::pinned_host); }

int run(const Options& o) {
  const int modes = !o.config.empty() + !o.params.empty() + !o.model.empty() + gpt_shape_given(o.shape);
  if (modes != 1) {
    ZEROTH_THROW(InvalidArgument,
                 "give one of --config CONFIG, --params COUNT, --model PRESET, or the GPT's --layers, --hidden and --heads");
  }
  if (!o.model.empty()) {
    if (o.layout_given() && !o.deepspeed_compatible) return run_shape(o, preset_shape(o.model, o.shape.seq_len, o.shape.vocab));
    return run_params(o);  // with --deepspeed-compatible too
  }
  if (gpt_shape_given(o.shape)) {
    if (o.deepspeed_compatible)
      ZEROTH_THROW(InvalidArgument, "--deepspeed-compatible goes with --params (DeepSpeed's tables take a count)");
    return run_shape(o, checked_gpt_shape(o.shape));
  }
  if (!o.params.empty()) return run_params(o);
  if (o.deepspeed_compatible)
    ZEROTH_THROW(InvalidArgument, "--deepspeed-compatible goes with --params (DeepSpeed's tables take a count)");
  nlohmann::json j = read_config_file(o.config);
  for (const auto& s : o.overrides) apply_override(j, s);
  const TrainConfig c = TrainConfig::from_json(j);
  const size_t device_budget = o.device_memory.empty() ? c.run.device_memory : parse_bytes(o.device_memory);
  const size_t host_budget = o.host_memory.empty() ? c.engine.host_memory : parse_bytes(o.host_memory);
  // On a GPU, no budget means the GPU's free memory, which is not known here.
  const bool device_known = device_budget > 0 || c.run.device == "cpu";
  const int per_node = c.run.world_size;  // one machine: every rank of the config on it

  // The run's own host memory is the same in every row; data that cannot be opened here (a token
  // file on another machine) leaves its tokens uncounted, and the output says so.
  size_t run_host = 0;
  std::string run_host_note;
  try {
    run_host = run_host_bytes(c);
  } catch (const Error& e) {
    run_host = run_host_bytes(c, false);
    run_host_note = fmt::format(" (its data not counted: {})", e.what());
  }
  if (c.data.format == DataFormat::bin && run_host_note.empty())
    run_host_note = " (token files are mapped: the pages a run reads are the page cache's, not counted)";

  // Each row is the config with its stage and offload devices changed, parsed as `zeroth train`
  // parses it (so every rule that depends on them applies) and planned as the engine plans it.
  std::vector<Row> rows;
  for (int stage = 0; stage <= 3; ++stage) {
    for (OffloadDevice opt : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}) {
      for (OffloadDevice par : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}) {
        if ((stage == 0 && opt != OffloadDevice::none) || (stage != 3 && par != OffloadDevice::none)) continue;
        if (par != OffloadDevice::none && opt == OffloadDevice::none)
          continue;  // DeepSpeed's rule: parameters only with the optimizer
        Row row;
        row.stage = stage, row.optimizer = opt, row.params = par;
        row.chosen = stage == c.engine.zero.stage && opt == c.engine.zero.offload_optimizer.device &&
                     par == c.engine.zero.offload_param.device;
        nlohmann::json v = j;
        auto& z = v["zero_optimization"];
        z["stage"] = stage;
        for (auto [key, device] : {std::pair{"offload_optimizer", opt}, std::pair{"offload_param", par}}) {
          if (!z.contains(key) || !z[key].is_object()) z[key] = nlohmann::json::object();
          z[key]["device"] = std::string(offload_device_name(device));
          if (device == OffloadDevice::nvme && !z[key].contains("nvme_path")) {
            z[key]["nvme_path"] = "runs/nvme-swap";
            row.assumed = "nvme_path runs/nvme-swap assumed";
          }
        }
        try {
          const TrainConfig rc = TrainConfig::from_json(v);
          // A pipeline's rows are its stage that holds the most.
          row.need = largest_stage(rc).need;
        } catch (const ConfigError& err) {
          row.refused = err.what();
        }
        row.need.run_host = run_host;
        rows.push_back(std::move(row));
      }
    }
  }

  auto fits = [&](const Row& r) {
    return r.refused.empty() && (device_budget == 0 || r.need.total(Tier::device) <= device_budget) &&
           (host_budget == 0 || host_bytes(r.need) <= host_budget);
  };
  auto fits_text = [&](const Row& r) -> std::string { return !device_known ? "?" : fits(r) ? "yes" : "no"; };
  if (o.json) {
    nlohmann::json out = {{"model_parameters", c.model.num_parameters()},
                          {"world_size", c.run.world_size},
                          {"ranks_per_node", per_node},  // one machine: host_bytes_per_node covers them all
                          {"device_memory", device_budget},
                          {"host_memory", host_budget},
                          {"rows", nlohmann::json::array()}};
    for (const auto& r : rows) {
      nlohmann::json row = {{"stage", r.stage},
                            {"offload_optimizer", offload_device_name(r.optimizer)},
                            {"offload_param", offload_device_name(r.params)},
                            {"config", r.chosen}};
      if (!r.assumed.empty()) row["assumed"] = r.assumed;
      if (!r.refused.empty()) {
        row["refused"] = r.refused;
      } else {
        nlohmann::json tiers = nlohmann::json::object();
        for (size_t t = 0; t < kTierCount; ++t) {
          nlohmann::json tags = nlohmann::json::object();
          for (size_t g = 0; g < kMemTagCount; ++g) tags[std::string(mem_tag_name(static_cast<MemTag>(g)))] = r.need.bytes[t][g];
          tiers[std::string(tier_name(static_cast<Tier>(t)))] = tags;
        }
        row.update({{"model_states_bytes_per_gpu", model_states_on_device(r.need)},
                    {"device_bytes", r.need.total(Tier::device)},
                    {"device_allowance_bytes", r.need.allowance},
                    {"pinned_host_bytes", r.need.total(Tier::pinned_host)},
                    {"host_bytes", r.need.total(Tier::host)},
                    {"host_bytes_per_node", host_bytes(r.need) * static_cast<size_t>(per_node)},
                    {"nvme_bytes", r.need.total(Tier::nvme)},
                    {"save_host_bytes", r.need.save_host},
                    {"run_host_bytes", r.need.run_host},
                    {"tiers", tiers}});
      }
      if (device_known) row["fits"] = fits(r);
      else row["fits"] = nullptr;  // a GPU's free memory, unknown here
      out["rows"].push_back(row);
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  // A mixture of experts: what a token meets, and how the experts are shared (each rank's plan
  // holds its slice; its activations, the rows its experts may receive).
  const std::string experts = c.model.moe.enabled()
                                  ? fmt::format(", {} active per token, experts over {} rank{}", c.model.active_parameters(),
                                                c.parallel.expert, c.parallel.expert == 1 ? "" : "s")
                                  : "";
  std::printf("zeroth estimate: %s (%s parameters%s, %d rank%s, %d per node), per rank; the engine's own plan and estimate\n",
              o.config.c_str(), fmt::format("{}", c.model.num_parameters()).c_str(), experts.c_str(), c.run.world_size,
              c.run.world_size == 1 ? "" : "s", per_node);
  std::printf("budgets per rank: device %s, host %s (pinned and pageable together)\n",
              device_budget           ? format_bytes(device_budget).c_str()
              : c.run.device == "cpu" ? "unlimited"
                                      : "the GPU's free memory (not known here: pass --device-memory)",
              host_budget ? format_bytes(host_budget).c_str() : "unlimited");
  std::printf("%-5s %-9s %-9s %14s %14s %14s %14s %14s  %s\n", "stage", "optimizer", "params", "model states", "device", "pinned host",
              "host", "nvme", "fits");
  for (const auto& r : rows) {
    if (!r.refused.empty()) {
      std::printf("%-5d %-9s %-9s  not a valid config: %s\n", r.stage, offload_device_name(r.optimizer).data(),
                  offload_device_name(r.params).data(), r.refused.c_str());
      continue;
    }
    std::printf("%-5d %-9s %-9s %14s %14s %14s %14s %14s  %s%s%s\n", r.stage, offload_device_name(r.optimizer).data(),
                offload_device_name(r.params).data(), format_bytes(model_states_on_device(r.need)).c_str(),
                format_bytes(r.need.total(Tier::device)).c_str(), format_bytes(r.need.total(Tier::pinned_host)).c_str(),
                format_bytes(r.need.total(Tier::host)).c_str(), format_bytes(r.need.total(Tier::nvme)).c_str(), fits_text(r).c_str(),
                r.chosen ? "   <- the config" : "", r.assumed.empty() ? "" : ("   (" + r.assumed + ")").c_str());
  }
  for (const auto& r : rows) {
    if (!r.chosen || !r.refused.empty()) continue;
    std::printf("\nthe config's row, by tag:\n  device: %s\n", r.need.describe(Tier::device).c_str());
    for (Tier t : {Tier::pinned_host, Tier::host, Tier::nvme})
      if (r.need.total(t) > 0) std::printf("  %s: %s\n", tier_name(t).data(), r.need.describe(t).c_str());
    std::printf("  and at initialization or a checkpoint's save or load, pageable host memory outside the engine's pools: %s (the "
                "initial values' chunk and bounce buffers, the weights file's gathered block, the checkpoint writer's largest owned "
                "range and staging, or a resume's largest block)\n",
                format_bytes(r.need.save_host).c_str());
    std::printf("  and the run's own pageable host memory: %s (its copy of the tokens, its loader's window order, its threads' "
                "stacks and allocator arenas)%s\n",
                format_bytes(r.need.run_host).c_str(), run_host_note.c_str());
  }
  std::printf(
      "model states: parameters, gradients and optimizer state on the device, as the ZeRO paper counts them; device "
      "includes the activations (%s), buffers, the end-of-run weights gather (other) and a %s allowance. fits: device and host "
      "against the budgets; free space for the nvme bytes is checked when the run starts, not here\n",
      rows.front().need.activation_note.c_str(), format_bytes(kEstimateAllowance).c_str());
  return 0;
}

}  // namespace

void add_estimate_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "estimate", "Memory for every ZeRO stage and offload placement: of a training config per rank, or of a parameter count per GPU");
  cmd->add_option("--config", o->config, "A training config (JSON); its model, batch, precision and ZeRO keys are used");
  cmd->add_option("--params", o->params, "Instead of a config: a parameter count (7.5B, 350M, 1T): the ZeRO paper's model states");
  cmd->add_option("--model", o->model,
                  fmt::format("Instead of a config: a preset ({}): its exact parameter count and largest block, as --params; with "
                              "any of --seq, --micro-batch, --tp, --pp, ...: its shape, as --layers",
                              fmt::join(GptConfig::preset_names(), ", ")));
  add_gpt_shape_options(cmd, o->shape, "Instead of a config: the GPT's dimensions, for activations too");
  auto& layout = o->layout_options;
  layout.push_back(cmd->get_option("--seq"));
  layout.push_back(cmd->add_option("--micro-batch", o->micro_batch, "With --layers or --model: sequences per micro-batch (default 1)")
                       ->check(CLI::Range(1, 1 << 20)));
  layout.push_back(cmd->add_option("--micro-batches", o->micro_batches, "With --pp: micro-batches per step (default 1)")
                       ->check(CLI::Range(1, 1 << 20)));
  layout.push_back(
      cmd->add_option("--tp", o->tp, "With --layers or --model: tensor-parallel degree (default 1)")->check(CLI::Range(1, 1 << 10)));
  layout.push_back(
      cmd->add_option("--pp", o->pp, "With --layers or --model: pipeline stages (default 1)")->check(CLI::Range(1, 1 << 16)));
  layout.push_back(cmd->add_flag("--sequence-parallel", o->sequence_parallel, "With --tp: sequence parallelism"));
  layout.push_back(cmd->add_flag("--gpipe", o->gpipe, "With --pp: GPipe's schedule (all micro-batches in flight) instead of 1F1B"));
  layout.push_back(cmd->add_option("--runtime-memory", o->runtime_memory,
                                   "With --layers or --model: device memory the CUDA runtime, NCCL and cuBLAS take (default 1GiB)"));
  cmd->add_option("--largest-layer", o->largest_layer,
                  "With --params: parameters of the largest layer (its working set when parameters are offloaded)");
  cmd->add_option("--gpus-per-node", o->gpus_per_node, "With --params, --model or --layers: GPUs per node (default 1)")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--nodes", o->nodes, "With --params, --model or --layers: nodes (default 1)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--set", o->overrides, "Override a key of the config: --set train_micro_batch_size_per_gpu=8")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--device-memory", o->device_memory,
                  "Device memory per rank (GPU) to fit in (default: run.device_memory with --config, else 80GiB as zeroth plan; 0: "
                  "unlimited)");
  cmd->add_option("--host-memory", o->host_memory,
                  "Host memory to fit in: per rank with --config (default: run.host_memory), per node otherwise (default 1TiB as "
                  "zeroth plan; 0: unlimited)");
  cmd->add_flag("--deepspeed-compatible", o->deepspeed_compatible,
                "With --params: DeepSpeed's own ZeRO-2 and ZeRO-3 estimate tables, with its exact numbers");
  cmd->add_flag("--json", o->json, "Print JSON: one row per stage and placement, bytes per tier and tag");
  cmd->callback([o] { run(*o); });
}

}  // namespace zeroth::tools
