// `zeroth plan`: the fastest layouts of a GPT on a cluster (planner/planner.h), printed with their
// memory, step time, MFU and what bounds each; `--emit-config` writes the fastest one this engine
// runs as a training config.
#include <chrono>     // std::chrono
#include <cmath>      // std::floor
#include <algorithm>  // std::find_if
#include <cstdio>     // std::printf
#include <fstream>    // std::ifstream, std::ofstream
#include <memory>     // std::make_shared
#include <string>     // std::string
#include <vector>     // std::vector

#include <CLI/CLI.hpp>        // CLI::App
#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"            // InvalidArgument
#include "core/memory.h"           // format_bytes, parse_bytes
#include "engine/plan/estimate.h"  // MemoryNeed
#include "planner/planner.h"       // search_plans
#include "tools/cli/commands.h"
#include "tools/cli/options.h"          // parse_count
#include "tools/cli/plan_tables.h"      // plan_json, print_table
#include "train/config/train_config.h"  // TrainConfig
#include "train/trainer.h"              // largest_stage

namespace zeroth::tools {
namespace plan_cmd {

using plan_tables::plan_json;
using plan_tables::print_table;

struct Options {
  std::string params, model;
  GptShape shape{0, 0, 0, 2048, 51200};
  std::string global_batch;
  uint64_t gpus = 0;
  Cluster cluster;
  std::string device_memory, runtime_memory, host_memory, nvme_capacity, peak_flops, intra_bw, inter_bw, pcie_bw, nvme_bw, cpu_rate;
  std::vector<std::string> calibrate;
  bool no_offload = false, runnable = false, json = false, max_seq = false;
  bool gpus_per_node_given = false;
  int stage = -1;
  size_t top = 10;
  std::string emit_config, emit_device = "cuda", data, nvme_path = "runs/nvme-swap";
};

GptShape shape_of(const Options& o, std::string& origin) {
  const bool dims = gpt_shape_given(o.shape);
  if (dims + !o.params.empty() + !o.model.empty() != 1)
    ZEROTH_THROW(InvalidArgument, "give the model as one of --model PRESET, --params COUNT, or --layers, --hidden and --heads");
  if (!o.model.empty()) {
    origin = "preset " + o.model;
    return preset_shape(o.model, o.shape.seq_len, o.shape.vocab);
  }
  if (dims) {
    origin = "as given";
    return checked_gpt_shape(o.shape);
  }
  const double count = parse_count(o.params, "--params");
  if (count < 1e9 || count > 2e12) {
    ZEROTH_THROW(InvalidArgument,
                 "--params {}: the shapes --params takes are Megatron-LM's published 1.7B to 1T ones, so counts from 1B to 2T; give "
                 "the model as --layers, --hidden and --heads instead",
                 o.params);
  }
  const auto p = static_cast<uint64_t>(count + 0.5);
  origin = fmt::format("Megatron-LM's published shape nearest {} parameters, layers scaled", p);
  return GptShape::from_params(p, o.shape.seq_len, o.shape.vocab);
}

void apply_options(Options& o) {
  Cluster& c = o.cluster;
  if (o.gpus > 0) {
    // Fewer GPUs than the default node holds: one node of them.
    if (!o.gpus_per_node_given && o.gpus < c.gpus_per_node) c.gpus_per_node = o.gpus;
    if (o.gpus % c.gpus_per_node != 0)
      ZEROTH_THROW(InvalidArgument, "--gpus {} is not a multiple of --gpus-per-node {}: give whole nodes, or --gpus-per-node {}",
                   o.gpus, c.gpus_per_node, o.gpus < c.gpus_per_node ? o.gpus : c.gpus_per_node);
    c.nodes = o.gpus / c.gpus_per_node;
  }
  if (!o.device_memory.empty()) c.device_memory = parse_bytes(o.device_memory);
  if (!o.runtime_memory.empty()) c.runtime_memory = parse_bytes(o.runtime_memory);
  if (!o.host_memory.empty()) c.host_memory = parse_bytes(o.host_memory);
  if (!o.nvme_capacity.empty()) c.nvme_capacity = parse_bytes(o.nvme_capacity);
  auto rate = [](const std::string& text, const char* flag, double& into) {
    if (!text.empty()) into = parse_count(text, flag);
  };
  rate(o.peak_flops, "--peak-flops", c.peak_flops);
  rate(o.intra_bw, "--intra-node-bw", c.intra_node_bw);
  rate(o.inter_bw, "--inter-node-bw", c.inter_node_bw);
  rate(o.pcie_bw, "--pcie-bw", c.pcie_bw);
  rate(o.nvme_bw, "--nvme-bw", c.nvme_bw);
  rate(o.cpu_rate, "--cpu-optimizer-rate", c.cpu_optimizer_rate);
}

// The plan as a training config this engine runs, checked by the trainer's own parser.
nlohmann::json config_of(const Options& o, const GptShape& shape, const Candidate& c) {
  const Layout& l = c.layout;
  nlohmann::json zero = {{"stage", l.stage}, {"overlap_comm", true}};
  for (auto [key, device] : {std::pair{"offload_optimizer", l.offload_optimizer}, std::pair{"offload_param", l.offload_param}}) {
    if (device == OffloadDevice::none) continue;
    zero[key] = {{"device", offload_device_name(device)}, {"pin_memory", true}};
    if (device == OffloadDevice::nvme) zero[key]["nvme_path"] = o.nvme_path;
  }
  nlohmann::json data;
  if (o.data.empty()) {
    // Enough synthetic tokens for the batches of a short run and their validation.
    const uint64_t batch_tokens = c.layout.sample_groups() * c.layout.micro_batch * c.layout.micro_batches * (shape.seq_len + 1);
    data = {{"format", "synthetic"},
            {"vocab_size", std::min<uint64_t>(shape.vocab, 65536)},
            {"tokens", std::max<uint64_t>(uint64_t{1} << 20, 16 * batch_tokens)}};
  } else {
    const bool bin = o.data.size() > 4 && o.data.substr(o.data.size() - 4) == ".bin";
    data = {{"format", bin ? "bin" : "text"}, {"train", o.data}};
  }
  nlohmann::json run = {{"device", o.emit_device}, {"world_size", l.dp * l.tp * l.pp}, {"steps", 100}};
  if (o.emit_device == "cpu") run["device_memory"] = format_bytes(o.cluster.device_memory);
  nlohmann::json j = {{"train_batch_size", l.sample_groups() * l.micro_batch * l.micro_batches},
                      {"train_micro_batch_size_per_gpu", l.micro_batch},
                      {"gradient_accumulation_steps", l.micro_batches},
                      {"gradient_clipping", 1.0},
                      {"bf16", {{"enabled", true}}},
                      {"optimizer",
                       {{"type", "AdamW"}, {"params", {{"lr", 3e-4}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.1}}}}},
                      {"zero_optimization", zero},
                      {"model", o.model.empty()
                                    ? nlohmann::json{{"n_layer", shape.layers},
                                                     {"n_embd", shape.hidden},
                                                     {"n_head", shape.heads},
                                                     {"seq_len", shape.seq_len},
                                                     {"vocab_size", shape.vocab},
                                                     {"activation_checkpointing", l.checkpointing == Checkpointing::full}}
                                    : nlohmann::json{{"preset", o.model},
                                                     {"seq_len", shape.seq_len},
                                                     {"activation_checkpointing", l.checkpointing == Checkpointing::full}}},
                      {"data", data},
                      {"run", run}};
  if (shape.moe()) {
    j["model"]["moe"] = {{"num_experts", shape.experts},
                         {"top_k", shape.top_k},
                         {"intermediate_size", shape.expert_ffn},
                         {"every", shape.moe_every}};
  }
  if (l.tp > 1 || l.pp > 1 || l.ep > 1 || l.sq > 1 || l.cp > 1) {
    j["parallel"] = {{"tensor", l.tp}, {"sequence_parallel", l.sequence_parallel}, {"pipeline", l.pp}, {"expert", l.ep}};
    if (l.pp > 1) j["parallel"]["schedule"] = pipe_kind_name(l.schedule), j["parallel"]["micro_batches"] = l.micro_batches;
    if (l.sq > 1) j["parallel"]["sequence"] = l.sq;
    if (l.cp > 1) j["parallel"]["context"] = l.cp;
  }
  if (l.tiled_mlp) j["model"]["tiled_mlp"] = true;
  if (l.host_checkpoints && l.checkpointing == Checkpointing::full) j["activation_checkpointing"] = {{"cpu_checkpointing", true}};
  TrainConfig::from_json(j);  // throws ConfigError naming the key if the trainer would refuse it
  return j;
}

// The ep column only for a mixture of experts.
// Long: the command's steps (calibration, the shape, the search, the emitted config, then the JSON or the report); the
// report reads everything the steps before it found.
void run(Options o) {
  apply_options(o);
  std::vector<std::string> calibrated;
  for (const auto& path : o.calibrate) {
    std::ifstream in(path);
    if (!in) ZEROTH_THROW(InvalidArgument, "--calibrate {}: cannot open it", path);
    nlohmann::json j;
    try {
      in >> j;
    } catch (const nlohmann::json::exception& e) {
      ZEROTH_THROW(InvalidArgument, "--calibrate {}: not JSON ({}); pass the output of zeroth bench ... --json", path, e.what());
    }
    for (auto& line : o.cluster.calibrate(j)) calibrated.push_back(path + ": " + line);
  }
  std::string origin;
  GptShape shape = shape_of(o, origin);
  if (o.shape.experts > 0 && !o.params.empty()) {
    ZEROTH_THROW(InvalidArgument,
                 "--params picks a dense shape by its count; give an expert model as --model PRESET or --layers, --hidden and "
                 "--heads with --experts");
  }
  if (o.shape.experts == 0 && (o.shape.top_k != 2 || o.shape.expert_ffn != 0 || o.shape.moe_every != 1))
    ZEROTH_THROW(InvalidArgument, "--top-k, --expert-ffn and --moe-every describe expert layers: give --experts too");
  shape.experts = o.shape.experts, shape.top_k = o.shape.top_k, shape.expert_ffn = o.shape.expert_ffn;
  shape.moe_every = o.shape.moe_every;
  if (const std::string bad = shape.problem(); !bad.empty()) ZEROTH_THROW(InvalidArgument, "the model's shape: {}", bad);
  // The longest window: one sequence a step unless told otherwise.
  if (o.global_batch.empty() && o.max_seq) o.global_batch = "1";
  if (o.global_batch.empty()) ZEROTH_THROW(InvalidArgument, "give --global-batch (sequences per optimizer step)");
  PlanSearch search;
  search.sequence = o.max_seq;
  // Ring attention's kernels run on the cpu device only: searched where the written config runs there.
  search.context = o.max_seq && o.emit_device == "cpu";
  const double batch = parse_count(o.global_batch, "--global-batch");
  if (batch != std::floor(batch)) ZEROTH_THROW(InvalidArgument, "--global-batch {}: give a whole number of sequences", o.global_batch);
  search.global_batch = static_cast<uint64_t>(batch);
  search.offload = !o.no_offload;
  search.runnable_only = o.runnable;
  search.stage = o.stage;
  search.top = o.top;
  const Cluster& c = o.cluster;

  const auto start = std::chrono::steady_clock::now();
  PlanResult result;
  WindowResult window;
  if (o.max_seq) {
    // Windows in steps of 1024 positions per GPU: every Ulysses size of the search divides them.
    window = longest_window(shape, c, search, 1024 * c.gpus(), GptConfig::kMaxSeqLen);
    if (window.seq_len == 0) {
      ZEROTH_THROW(OutOfMemory, "--max-seq: not even a window of {} positions fits the cluster with any layout: add GPUs or memory",
                   1024 * c.gpus());
    }
    shape.seq_len = window.seq_len;
    result = std::move(window.plans);
  } else {
    result = search_plans(shape, c, search);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (result.considered == 0) {
    ZEROTH_THROW(InvalidArgument,
                 "no split of the {} GPUs into dp x tp x pp (tp dividing the {} GPUs per node and the {} heads, pp the {} layers) "
                 "has a data-parallel degree dividing the global batch of {}: give a --global-batch that is a multiple of {}",
                 c.gpus(), c.gpus_per_node, shape.heads, shape.layers, search.global_batch, c.gpus() / c.gpus_per_node);
  }

  // The fastest plan this engine runs whose config the engine's own estimate (the plan it would
  // build, its activations and buffers) also fits, for --emit-config.
  Candidate runnable;
  bool have_runnable = false;
  std::string emit_problem;
  MemoryNeed engine_need;
  if (!o.emit_config.empty()) {
    PlanSearch r = search;
    r.runnable_only = true;
    r.top = 50;
    const PlanResult rr = search_plans(shape, c, r);
    for (const Candidate& cand : rr.best) {
      const nlohmann::json config = config_of(o, shape, cand);
      // The rank of the pipeline stage that holds the most, as the trainer plans it.
      const MemoryNeed need = largest_stage(TrainConfig::from_json(config)).need;
      const bool device_ok = need.total(Tier::device) + c.runtime_memory <= c.device_memory;
      const bool host_ok = c.host_memory == 0 ||
                           (need.total(Tier::host) + need.total(Tier::pinned_host)) * c.gpus_per_node <= c.host_memory;
      if (!device_ok || !host_ok) continue;
      runnable = cand, engine_need = need, have_runnable = true;
      std::ofstream out(o.emit_config);
      out << config.dump(2) << "\n";
      if (!out) ZEROTH_THROW(InvalidArgument, "--emit-config {}: cannot write it", o.emit_config);
      break;
    }
    if (!have_runnable) {
      emit_problem = fmt::format(
          "--emit-config: no plan with full or no recomputation (selective recomputation is the planner's alone) fits by the "
          "engine's own estimate ({} of {} such plans fit by the layout model, the fastest 50 tried); give more GPUs or memory, or "
          "a smaller model",
          rr.fitting, rr.considered);
    }
  }

  if (o.json) {
    nlohmann::json out = {{"model",
                           {{"params", shape.params()},
                            {"active_params", shape.active_params()},
                            {"experts", shape.experts},
                            {"top_k", shape.top_k},
                            {"expert_ffn", shape.expert_width()},
                            {"moe_every", shape.moe_every},
                            {"architecture", shape.llama ? "llama" : "gpt2"},
                            {"layers", shape.layers},
                            {"hidden", shape.hidden},
                            {"heads", shape.heads},
                            {"kv_heads", shape.kv_heads > 0 ? shape.kv_heads : shape.heads},
                            {"ffn", shape.mlp_width()},
                            {"tied", shape.tied},
                            {"seq_len", shape.seq_len},
                            {"vocab", shape.vocab}}},
                          {"global_batch", search.global_batch},
                          {"max_seq", o.max_seq ? nlohmann::json(window.seq_len) : nlohmann::json(nullptr)},
                          {"max_seq_capped", o.max_seq && window.capped},
                          {"cluster",
                           {{"gpus_per_node", c.gpus_per_node},
                            {"nodes", c.nodes},
                            {"device_memory", c.device_memory},
                            {"host_memory_per_node", c.host_memory},
                            {"peak_flops", c.peak_flops},
                            {"matmul_efficiency", c.matmul_efficiency},
                            {"intra_node_bw", c.intra_node_bw},
                            {"inter_node_bw", c.inter_node_bw},
                            {"pcie_bw", c.pcie_bw},
                            {"nvme_bw", c.nvme_bw},
                            {"cpu_optimizer_rate", c.cpu_optimizer_rate}}},
                          {"calibrated", calibrated},
                          {"considered", result.considered},
                          {"fitting", result.fitting},
                          {"search_seconds", seconds},
                          {"plans", nlohmann::json::array()}};
    for (const auto& p : result.best) out["plans"].push_back(plan_json(p));
    if (have_runnable) {
      out["emitted"] = {{"path", o.emit_config},
                        {"plan", plan_json(runnable)},
                        {"engine_device_bytes", engine_need.total(Tier::device)},
                        {"engine_host_bytes", engine_need.total(Tier::host) + engine_need.total(Tier::pinned_host)}};
    }
    std::printf("%s\n", out.dump(2).c_str());
    std::fflush(stdout);
    if (result.best.empty()) ZEROTH_THROW(OutOfMemory, "no layout of this model fits the cluster: add GPUs or memory");
    if (!emit_problem.empty()) ZEROTH_THROW(OutOfMemory, "{}", emit_problem);
    return;
  }
  std::printf("zeroth plan: %s of %s parameters%s (%s; %s), global batch %llu sequences\n", shape.llama ? "Llama" : "GPT",
              fmt::format("{}", shape.params()).c_str(),
              shape.moe() ? fmt::format(", {} active per token", shape.active_params()).c_str() : "", shape.describe().c_str(),
              origin.c_str(), static_cast<unsigned long long>(search.global_batch));
  std::printf("cluster: %llu GPUs (%llu per node x %llu nodes), %s and %.3g TFLOP/s peak each, matmuls at %.2f of peak; "
              "all-reduce %.3g GB/s in a node, network %.3g GB/s per node, PCIe %.3g GB/s per GPU, NVMe %.3g GB/s and host %s per "
              "node, CPU Adam %.2g parameters/s per node\n",
              static_cast<unsigned long long>(c.gpus()), static_cast<unsigned long long>(c.gpus_per_node),
              static_cast<unsigned long long>(c.nodes), format_bytes(c.device_memory).c_str(), c.peak_flops / 1e12,
              c.matmul_efficiency, c.intra_node_bw / 1e9, c.inter_node_bw / 1e9, c.pcie_bw / 1e9, c.nvme_bw / 1e9,
              format_bytes(c.host_memory).c_str(), c.cpu_optimizer_rate);
  for (const auto& line : calibrated) std::printf("calibrated: %s\n", line.c_str());
  if (o.max_seq) {
    std::printf("longest window: %s positions (%.2fM; %llu windows searched by halving, in steps of %llu)%s; at it:\n",
                fmt::format("{}", window.seq_len).c_str(), static_cast<double>(window.seq_len) / (1 << 20),
                static_cast<unsigned long long>(window.probes), static_cast<unsigned long long>(1024 * c.gpus()),
                window.capped
                    ? fmt::format(", the most model.seq_len takes ({}): longer ones would fit too", GptConfig::kMaxSeqLen).c_str()
                    : "");
  }
  std::printf("searched %s layouts in %.3f s: %s fit\n\n", fmt::format("{}", result.considered).c_str(), seconds,
              fmt::format("{}", result.fitting).c_str());
  if (result.best.empty()) {
    std::printf("no layout fits. The smallest (%s) needs %s per GPU on the device, %s of host memory per node.\n",
                result.smallest.layout.describe().c_str(), format_bytes(result.smallest.memory.device).c_str(),
                format_bytes(result.smallest.memory.host * c.gpus_per_node).c_str());
    std::fflush(stdout);
    ZEROTH_THROW(OutOfMemory, "no layout of this model fits the cluster: add GPUs or memory{}",
                 search.offload ? "" : ", or allow offload (drop --no-offload)");
  }
  print_table(result.best, c.gpus_per_node, shape.moe(), o.max_seq);
  const Candidate& best = result.best.front();
  const StepCost& k = best.cost;
  std::printf("\nbest: %s\n  step %.3f s = compute %.3f + bubble %.3f + tensor-parallel %.3f + pipeline send/recv %.3f + "
              "%s%sdata-parallel %.3f + offload %.3f + optimizer %.3f (exposed seconds); MFU %.1f%%\n",
              best.layout.describe().c_str(), k.step, k.compute, k.bubble, k.tensor, k.pipeline,
              shape.moe() ? fmt::format("expert all-to-all {:.3f} + ", k.experts).c_str() : "",
              best.layout.sq > 1   ? fmt::format("Ulysses all-to-all {:.3f} + ", k.sequence).c_str()
              : best.layout.cp > 1 ? fmt::format("ring attention's sends {:.3f} + ", k.sequence).c_str()
                                   : "",
              k.data, k.offload, k.optimizer, 100 * k.mfu);
  std::printf("  memory per GPU: model states %s, activations %s (%llu micro-batch%s in flight), buffers %s, allowance %s = %s; "
              "host %s and NVMe %s per node\n",
              format_bytes(best.memory.model_states).c_str(), format_bytes(best.memory.activations).c_str(),
              static_cast<unsigned long long>(best.memory.in_flight), best.memory.in_flight == 1 ? "" : "es",
              format_bytes(best.memory.buffers).c_str(), format_bytes(best.memory.allowance).c_str(),
              format_bytes(best.memory.device).c_str(), format_bytes(best.memory.host * c.gpus_per_node).c_str(),
              format_bytes(best.memory.nvme * c.gpus_per_node).c_str());
  if (best.layout.checkpointing == Checkpointing::selective) {
    const auto runs = std::find_if(result.best.begin(), result.best.end(),
                                   [](const Candidate& p) { return p.layout.checkpointing != Checkpointing::selective; });
    if (runs != result.best.end()) {
      std::printf("  selective recomputation is the planner's alone; the fastest above that zeroth runs: #%td, %s, %.3f s per step\n",
                  runs - result.best.begin() + 1, runs->layout.describe().c_str(), runs->cost.step);
    } else {
      std::printf("  selective recomputation is the planner's alone; none above runs on zeroth's engine: --runnable lists those\n");
    }
  }
  std::printf("model: step time from FLOPs at the matmul rate, ring collectives, bubble (p-1)/(m+p-1), PCIe/NVMe/CPU optimizer "
              "(planner/planner.h); memory: ZeRO paper model states, Korthikanti et al. activations, %s runtime + %.0f%% "
              "fragmentation allowance (planner/gpt_layout.h). selective*: Korthikanti et al.'s selective recomputation, which "
              "the planner models and zeroth's engine does not run (--runnable leaves it out).\n",
              format_bytes(c.runtime_memory).c_str(), 100 * kFragmentation);
  if (o.max_seq) {
    std::printf("sq: the ranks sharing each sample, Ulysses' (a number) or ring attention's (C and its size)%s.\n",
                search.context
                    ? "; zeroth runs ring attention on the cpu device only: its rows here are costed on the cluster as given"
                    : "; ring attention is searched with --emit-device cpu only (zeroth has no CUDA ring kernels)");
  }
  if (!emit_problem.empty()) {
    std::fflush(stdout);
    ZEROTH_THROW(OutOfMemory, "{}", emit_problem);
  }
  if (have_runnable) {
    std::printf("\nwrote %s: %s (%.3g s per step, MFU %.1f%%; the engine's own estimate of it: %s on the device, %s on the host)%s; "
                "check it with `zeroth estimate --config %s`%s\n",
                o.emit_config.c_str(), runnable.layout.describe().c_str(), runnable.cost.step, 100 * runnable.cost.mfu,
                format_bytes(engine_need.total(Tier::device)).c_str(),
                format_bytes(engine_need.total(Tier::host) + engine_need.total(Tier::pinned_host)).c_str(),
                best.layout.checkpointing == Checkpointing::selective
                    ? ", the fastest without selective recomputation, which this engine does not run yet"
                    : "",
                o.emit_config.c_str(), o.data.empty() ? "; its data section is synthetic tokens: point data.train at yours" : "");
  }
}

}  // namespace plan_cmd

void add_plan_command(CLI::App& app) {
  using namespace plan_cmd;
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("plan",
                                 "Search dp x tp x pp, ZeRO stage, offload, micro-batch and recomputation for a GPT on a cluster; "
                                 "rank what fits by modelled step time");
  cmd->add_option("--params", o->params, "The model as a parameter count (7.5B, 175B, 1T): Megatron-LM's nearest published shape");
  cmd->add_option("--model", o->model, "Instead of --params, a preset's published shape (llama-3-70b, llama-3-8b, smollm-135m, ...)");
  add_gpt_shape_options(cmd, o->shape, "Instead of --params, the model's dimensions");
  cmd->add_option("--experts", o->shape.experts, "Mixture of experts: experts per expert layer (searches expert parallelism too)")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--top-k", o->shape.top_k, "With --experts: experts per token (default 2)")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--expert-ffn", o->shape.expert_ffn, "With --experts: each expert's width (default the MLP's)")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--moe-every", o->shape.moe_every, "With --experts: every n-th layer has experts (default 1)")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--global-batch", o->global_batch, "Sequences per optimizer step (required but with --max-seq: 1)");
  cmd->add_flag("--max-seq", o->max_seq,
                "The longest window the cluster trains the model at: Ulysses over the data-parallel ranks, the tiled MLP and host "
                "checkpoints searched too (and ring attention with --emit-device cpu, where its kernels run)");
  auto* gpus = cmd->add_option("--gpus", o->gpus, "GPUs in all (sets --nodes from --gpus-per-node)")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--gpus-per-node", o->cluster.gpus_per_node, "GPUs per node (default 8; with fewer --gpus, those)")
      ->check(CLI::Range(1, 1 << 10))
      ->each([o](const std::string&) { o->gpus_per_node_given = true; });
  cmd->add_option("--nodes", o->cluster.nodes, "Nodes (default 1)")->check(CLI::Range(1, 1 << 20))->excludes(gpus);
  cmd->add_option("--device-memory", o->device_memory, "Memory per GPU (default 80GiB)");
  cmd->add_option("--runtime-memory", o->runtime_memory,
                  "Device memory per GPU the CUDA context, NCCL and cuBLAS take (default 1GiB; 0 for the CPU device)");
  cmd->add_option("--host-memory", o->host_memory, "Host memory per node (default 1TiB)");
  cmd->add_option("--nvme-capacity", o->nvme_capacity, "NVMe space per node (default unlimited)");
  cmd->add_option("--peak-flops", o->peak_flops, "Peak dense 16-bit FLOP/s per GPU (default 312T, A100)");
  cmd->add_option("--matmul-efficiency", o->cluster.matmul_efficiency, "Fraction of peak the matmuls reach (default 0.6)")
      ->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--intra-node-bw", o->intra_bw, "All-reduce bus bandwidth inside a node, bytes/s (default 230G)");
  cmd->add_option("--inter-node-bw", o->inter_bw, "Network bandwidth per node, bytes/s (default 200G)");
  cmd->add_option("--pcie-bw", o->pcie_bw, "Host <-> GPU bandwidth per GPU, bytes/s (default 24G)");
  cmd->add_option("--nvme-bw", o->nvme_bw, "NVMe bandwidth per node, bytes/s (default 25G)");
  cmd->add_option("--cpu-optimizer-rate", o->cpu_rate, "CPU Adam parameters per second per node (default 5G)");
  cmd->add_option("--calibrate", o->calibrate,
                  "Outputs of zeroth bench train|comm|optim|offload --json: take the constants they measure")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--stage", o->stage, "Only this ZeRO stage")->check(CLI::Range(0, 3));
  cmd->add_flag("--no-offload", o->no_offload, "Keep all state on the GPUs");
  cmd->add_flag("--runnable", o->runnable,
                "Only layouts this engine runs: without selective recomputation (the planner's alone; the table marks it)");
  cmd->add_option("--top", o->top, "Plans to print (default 10)")->check(CLI::Range(1, 1000));
  cmd->add_option("--emit-config", o->emit_config, "Write the fastest plan this engine runs as a training config (JSON)");
  cmd->add_option("--emit-device", o->emit_device, "run.device of the written config (default cuda)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  cmd->add_option("--data", o->data, "data.train of the written config (.bin: llm.c tokens; else text); default synthetic tokens");
  cmd->add_option("--nvme-path", o->nvme_path, "nvme_path of the written config's offload (default runs/nvme-swap)");
  cmd->add_flag("--json", o->json, "Print JSON");
  cmd->callback([o] { run(*o); });
}

}  // namespace zeroth::tools
