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
#include "tools/cli/estimate.h"  // EstimateOptions, estimate_params, estimate_shape
#include "tools/cli/options.h"
#include "train/run_folder.h"           // resolve_config_paths
#include "train/config/train_config.h"  // TrainConfig
#include "train/trainer.h"              // largest_stage

namespace zeroth::tools {
namespace estimate_cmd {

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

// Long: the choice of mode, then the config's rows (each stage and offload placement, parsed and planned), then the JSON or
// the table; both outputs read the same rows.
int run(const EstimateOptions& o) {
  const int modes = !o.config.empty() + !o.params.empty() + !o.model.empty() + gpt_shape_given(o.shape);
  if (modes != 1) {
    ZEROTH_THROW(InvalidArgument,
                 "give one of --config CONFIG, --params COUNT, --model PRESET, or the GPT's --layers, --hidden and --heads");
  }
  if (!o.model.empty()) {
    if (o.layout_given() && !o.deepspeed_compatible) return estimate_shape(o, preset_shape(o.model, o.shape.seq_len, o.shape.vocab));
    return estimate_params(o);  // with --deepspeed-compatible too
  }
  if (gpt_shape_given(o.shape)) {
    if (o.deepspeed_compatible)
      ZEROTH_THROW(InvalidArgument, "--deepspeed-compatible goes with --params (DeepSpeed's tables take a count)");
    return estimate_shape(o, checked_gpt_shape(o.shape));
  }
  if (!o.params.empty()) return estimate_params(o);
  if (o.deepspeed_compatible)
    ZEROTH_THROW(InvalidArgument, "--deepspeed-compatible goes with --params (DeepSpeed's tables take a count)");
  nlohmann::json j = read_config_file(o.config);
  for (const auto& s : o.overrides) apply_override(j, s);
  // Its files from where `zeroth train` reads them: the working folder, else the config's.
  resolve_config_paths(j, o.config);
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

}  // namespace estimate_cmd

void add_estimate_command(CLI::App& app) {
  using namespace estimate_cmd;
  auto o = std::make_shared<EstimateOptions>();
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
  layout.push_back(
      cmd->add_option("--sequence", o->sequence,
                      "With --layers or --model: Ulysses ranks sharing each sample (of the data-parallel ranks; default 1)")
          ->check(CLI::Range(1, 1 << 12)));
  layout.push_back(cmd->add_option("--context", o->context,
                                   "With --layers or --model: ring attention's ranks sharing each sample (of the data-parallel ranks; "
                                   "default 1)")
                       ->check(CLI::Range(1, 1 << 12)));
  layout.push_back(cmd->add_flag("--tiled-mlp", o->tiled_mlp, "With --layers or --model: the MLP by tiles (model.tiled_mlp)"));
  layout.push_back(cmd->add_flag("--host-checkpoints", o->host_checkpoints,
                                 "With --layers or --model: full recomputation's checkpoints in host memory (cpu_checkpointing)"));
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
