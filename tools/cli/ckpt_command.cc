// `zeroth ckpt inspect | export | reshard | import`: checkpoints without a training run. Every
// command that reads a checkpoint verifies all of its files first, so nothing is ever read out of
// a damaged one.
#include <algorithm>   // std::find_if, std::any_of
#include <chrono>      // std::chrono::steady_clock
#include <cstdio>      // std::printf
#include <filesystem>  // std::filesystem
#include <memory>      // std::make_shared
#include <string>      // std::string
#include <vector>      // std::vector

#include <CLI/CLI.hpp>        // CLI::App
#include <fmt/format.h>       // fmt::format
#include <fmt/ranges.h>       // fmt::join
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/dtype.h"                    // DType
#include "core/error.h"                    // ZEROTH_THROW
#include "core/memory.h"                   // format_bytes
#include "engine/checkpoint/checkpoint.h"  // ckpt::write
#include "engine/checkpoint/format.h"      // ckpt::read_manifest, ckpt::verify_file
#include "engine/plan/plan.h"              // make_plan
#include "models/decoder/gpt.h"            // Gpt
#include "optim/loss_scaler.h"             // LossScaler
#include "tools/cli/commands.h"
#include "train/hf/export.h"            // add_lora_delta, write_peft_adapter
#include "train/hf/weights.h"           // HfWriter, HfModelReader
#include "train/run_folder.h"           // refuse_export_into
#include "train/text/tokenizer.h"       // write_hf_tokenizer_files
#include "train/config/train_config.h"  // TrainConfig

namespace zeroth::tools {
namespace ckpt_cmd {

using Clock = std::chrono::steady_clock;

struct Opened {
  std::string dir;
  ckpt::Manifest manifest;
};

// The step folder's manifest, with every file checked (CheckpointError naming each bad one).
Opened open_verified(const std::string& path, bool print) {
  Opened o{ckpt::resolve(path), {}};
  o.manifest = ckpt::read_manifest(o.dir);
  const auto t0 = Clock::now();
  uint64_t read = 0;
  std::vector<std::string> problems;
  for (const auto& f : o.manifest.files) {
    const ckpt::FileCheck c = ckpt::verify_file(o.dir, f);
    read += c.read_bytes;
    if (print) {
      std::printf("    %-16s %12s  xxh3-64 %s  %s\n", f.name.c_str(), format_bytes(f.bytes).c_str(), ckpt::hex64(f.xxh3).c_str(),
                  c.problem == ckpt::FileCheck::Problem::none ? "ok" : "BAD");
    }
    if (c.problem != ckpt::FileCheck::Problem::none) problems.push_back(c.describe(o.dir, f));
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!problems.empty()) throw CheckpointError(fmt::format("{}; do not use this checkpoint", fmt::join(problems, "; ")));
  if (print) {
    std::printf("  verified   %s read in %.2f s (%.2f GB/s): every file has the manifest's size and checksum\n",
                format_bytes(read).c_str(), s, s > 0 ? static_cast<double>(read) / s * 1e-9 : 0.0);
  }
  return o;
}

// The run's config as saved in the manifest.
TrainConfig saved_config(const Opened& o) {
  try {
    // Only the model and engine sections matter here; a launched run's backend (gloo, nccl) would
    // ask for a launcher.
    nlohmann::json config = o.manifest.config;
    if (config.contains("run") && config["run"].is_object()) config["run"]["backend"] = "local";
    // The model's shape is spelled out (model.vocab_size too): a tokenizer moved since is not needed.
    if (config.contains("data") && config["data"].is_object() && config["data"].value("tokenizer", nlohmann::json()).is_string()) {
      std::error_code ec;
      if (!std::filesystem::exists(config["data"]["tokenizer"].get<std::string>(), ec)) config["data"].erase("tokenizer");
    }
    return TrainConfig::from_json(config);
  } catch (const Error& e) {
    throw CheckpointError(fmt::format("{}/{}: the saved config does not parse ({})", o.dir, ckpt::kManifestName, e.what()));
  }
}

std::string dims(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// The checkpoint's tensor for a parameter of the saved config's GPT; CheckpointError when it is
// missing or of another shape.
const ckpt::TensorEntry* saved_tensor(const Opened& o, const BlockSpec& block, const ParamSpec& param) {
  const std::string name = block.name + "." + param.name;
  const ckpt::TensorEntry* t = o.manifest.find(name);
  if (t == nullptr || t->shape != param.shape) {
    throw CheckpointError(fmt::format("{}: tensor {} {} of the saved config's GPT is {} in the checkpoint", o.dir, name,
                                      dims(param.shape), t == nullptr ? "missing" : dims(t->shape)));
  }
  return t;
}

void inspect(const std::string& path) {
  const std::string dir = ckpt::resolve(path);
  const ckpt::Manifest m = ckpt::read_manifest(dir);
  std::printf("checkpoint %s (%s, version %d)\n", dir.c_str(), ckpt::kFormat, m.version);
  std::printf("  step       %lld (%lld optimizer updates applied)\n", static_cast<long long>(m.step),
              static_cast<long long>(m.engine.value("steps_applied", int64_t{0})));
  if (m.config.contains("run")) std::printf("  run        %s\n", m.config["run"].value("name", std::string("?")).c_str());
  if (m.config.contains("model")) std::printf("  model      %s\n", m.config["model"].dump().c_str());
  const auto& w = m.world;
  std::printf("  world      dp %d x tp %d x pp %d, ZeRO stage %d, offload: optimizer %s, parameters %s\n", w.value("dp", 0),
              w.value("tp", 1), w.value("pp", 1), w.value("zero_stage", 0), w.value("offload_optimizer", std::string("?")).c_str(),
              w.value("offload_param", std::string("?")).c_str());
  uint64_t elements = 0;
  for (const auto& t : m.tensors) elements += t.numel();
  std::printf("  state      %s: %s (%llu elements each, f32)\n", m.optimizer.c_str(),
              fmt::format("{}", fmt::join(m.states, ", ")).c_str(), static_cast<unsigned long long>(elements));
  std::printf("  tensors    %zu%s\n", m.tensors.size(),
              w.value("tp", 1) > 1 ? " (a split tensor's ranges count its stored order: each tensor-parallel part's elements in turn)"
                                   : "");
  for (const auto& t : m.tensors) {
    std::string pieces;
    for (const auto& p : t.pieces[0]) pieces += fmt::format(" {}:[{}, {})", p.file, p.lo, p.hi);
    const std::string split = t.split.split()
                                  ? fmt::format(" split on axis {}{} in {} parts", t.split.axis,
                                                t.split.groups > 1 ? fmt::format(" ({} segments)", t.split.groups) : "", t.split.ranks)
                                  : "";
    std::printf("    %-28s %-16s %10llu%s  fp32 in file:[range)%s\n", t.name.c_str(), dims(t.shape).c_str(),
                static_cast<unsigned long long>(t.numel()), split.c_str(), pieces.c_str());
  }
  std::printf("  files      %zu, %s in all\n", m.files.size(), format_bytes(m.data_bytes()).c_str());
  std::fflush(stdout);
  open_verified(dir, true);
}

DType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "fp32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16" || s == "fp16") return DType::f16;
  ZEROTH_THROW(InvalidArgument, "--dtype {} is not one of: f32, bf16, f16", s);
}

// `out`: a .safetensors file (format safetensors) or a model folder (format hf).
// A LoRA run's checkpoint: with `merge_lora` the adapted weights are W + scale B A; without, the base
// weights are written and (format hf) PEFT's adapter files beside them.
// Long: the checks of the arguments, the weights streamed tensor by tensor (the adapters' merge on the way), the tokenizer
// files and the summary line.
void export_weights(const std::string& path, const std::string& out, const std::string& dtype, const std::string& format,
                    const std::string& shard_size, bool merge_lora) {
  const DType type = parse_dtype(dtype);
  if (format != "hf" && format != "safetensors") ZEROTH_THROW(InvalidArgument, "--format {} is not one of: hf, safetensors", format);
  if (format == "hf" && out.ends_with(".safetensors"))
    ZEROTH_THROW(InvalidArgument, "--format hf writes a folder (config.json, shards, index); --out {} names a file", out);
  if (format == "safetensors" && !out.ends_with(".safetensors"))
    ZEROTH_THROW(InvalidArgument, "--out {} must end in .safetensors for --format safetensors (or use --format hf for a folder)", out);
  const uint64_t shard_bytes = parse_bytes(shard_size);
  if (format == "hf") refuse_export_into(out);
  const Opened o = open_verified(path, false);
  const TrainConfig c = saved_config(o);
  const LoraConfig& lora = c.model.lora;
  if (merge_lora && !lora.enabled()) ZEROTH_THROW(InvalidArgument, "--merge-lora: {} was saved by a run without LoRA adapters", o.dir);
  if (lora.enabled() && !merge_lora && format != "hf") {
    ZEROTH_THROW(InvalidArgument,
                 "{} holds LoRA adapters, which one safetensors file of the base would drop: add --merge-lora for the merged "
                 "weights, or use --format hf for the base with PEFT's adapter files beside it",
                 o.dir);
  }
  const auto specs = Gpt::block_specs(c.model);
  ckpt::Reader reader(o.dir, o.manifest);
  auto read = [&](const BlockSpec& block, const ParamSpec& p, std::vector<float>& into) {
    into.resize(p.numel());
    reader.read(*saved_tensor(o, block, p), 0, 0, p.numel(), into.data());
  };
  const auto t0 = Clock::now();
  HfWriter writer(c.model, out, type, shard_bytes);
  std::vector<float> values, a, b;
  while (!writer.done()) {
    const BlockSpec& block = specs[writer.block()];
    const auto& p = block.params[writer.param()];
    read(block, p, values);
    // An adapted weight: its layer's adapter block holds "<module>.lora_A.weight" and lora_B.
    const auto adapters = std::find_if(specs.begin(), specs.end(), [&](const BlockSpec& s) { return s.name == block.name + ".lora"; });
    const std::string module = p.name.ends_with(".weight") ? p.name.substr(0, p.name.size() - 7) : std::string();
    const auto has = [&](const std::string& name) {
      return adapters != specs.end() &&
             std::any_of(adapters->params.begin(), adapters->params.end(), [&](const ParamSpec& q) { return q.name == name; });
    };
    if (merge_lora && !module.empty() && has(module + ".lora_A.weight")) {
      const auto param = [&](const std::string& name) {
        return *std::find_if(adapters->params.begin(), adapters->params.end(), [&](const ParamSpec& q) { return q.name == name; });
      };
      const ParamSpec pa = param(module + ".lora_A.weight"), pb = param(module + ".lora_B.weight");
      read(*adapters, pa, a);
      read(*adapters, pb, b);
      add_lora_delta(values.data(), a.data(), b.data(), static_cast<size_t>(p.shape[0]), static_cast<size_t>(p.shape[1]),
                     static_cast<size_t>(pa.shape[0]), lora.scale());
    }
    writer.write(values.data());
  }
  const uint64_t bytes = writer.finish();
  if (lora.enabled() && !merge_lora) {
    write_peft_adapter(
        out, c.model,
        [&](int block, size_t param, float* into) {
      std::vector<float> v;
      read(specs[block], specs[block].params[param], v);
      std::copy(v.begin(), v.end(), into);
        },
        type, c.run.init_from);
  }
  // The run's tokenizer goes with the weights, so the folder loads as a model with its tokenizer.
  std::string tokenizer_note;
  if (format == "hf") {
    const nlohmann::json& data = o.manifest.config.value("data", nlohmann::json::object());
    const std::string tokenizer = data.is_object() && data.value("tokenizer", nlohmann::json()).is_string()
                                      ? data["tokenizer"].get<std::string>()
                                      : std::string();
    std::error_code ec;
    if (tokenizer.empty()) {
      tokenizer_note = "; no tokenizer files (the run read text as bytes or token files)";
    } else if (!std::filesystem::exists(tokenizer, ec)) {
      tokenizer_note = fmt::format("; the run's tokenizer {} is gone, so no tokenizer files", tokenizer);
    } else {
      const auto files = write_hf_tokenizer_files(tokenizer, out, c.model.max_positions > 0 ? c.model.max_positions : c.model.seq_len);
      tokenizer_note = fmt::format("; {} from {}", fmt::join(files, ", "), tokenizer);
    }
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "exported %s (step %lld) to %s: %s of %s weights as Hugging Face's %s%s, in %.2f s\n", o.dir.c_str(),
      static_cast<long long>(o.manifest.step), out.c_str(), format_bytes(bytes).c_str(), dtype_name(type).data(),
      c.model.hf_architecture().c_str(),
      format == "hf"
          ? fmt::format(" (config.json and {} shard{}{})", writer.shards(), writer.shards() == 1 ? "" : "s", tokenizer_note).c_str()
          : "",
      s);
}

// The plan geometry of `c`'s GPT at `dp` ranks (what its ranks own), for writing a checkpoint as
// they would have.
Plan layout(const TrainConfig& c, int dp) { return make_plan(Gpt::block_specs(c.model), Gpt::schedule(c.model), c.engine, dp, 0); }

void reshard(const std::string& path, int dp, const std::string& out) {
  const Opened o = open_verified(path, false);
  const TrainConfig c = saved_config(o);
  const auto specs = Gpt::block_specs(c.model);
  const Plan plan = layout(c, dp);
  std::vector<const ckpt::TensorEntry*> tensors;
  for (const auto& s : specs)
    for (const auto& p : s.params) tensors.push_back(saved_tensor(o, s, p));
  ckpt::Reader reader(o.dir, o.manifest);
  ckpt::Manifest header = o.manifest;
  const ckpt::IoStats io = ckpt::write(
      specs, plan, header,
      [&](size_t tensor, int state, uint64_t lo, uint64_t hi, float* values) { reader.read(*tensors[tensor], state, lo, hi, values); },
      out);
  std::printf("resharded %s (dp %d) to %s for dp %d: %zu files, %s in %.2f s\n", o.dir.c_str(), o.manifest.world.value("dp", 0),
              io.path.c_str(), dp, static_cast<size_t>(dp), format_bytes(io.bytes).c_str(), io.seconds);
}

void import_weights(const std::string& from, const std::string& config_path, const std::string& out) {
  const TrainConfig c = TrainConfig::from_json(read_config_file(config_path));
  const auto specs = Gpt::block_specs(c.model);
  const Plan plan = layout(c, c.run.world_size);
  // Tensor by tensor, each range the checkpoint's files ask for read from its shard.
  check_hf_config(c.model, from);
  HfModelReader weights(c.model, from);
  std::vector<std::pair<int, size_t>> param_of;  // the checkpoint's tensor order: block, parameter
  for (size_t b = 0; b < specs.size(); ++b)
    for (size_t i = 0; i < specs[b].params.size(); ++i) param_of.emplace_back(static_cast<int>(b), i);
  ckpt::Manifest m;
  m.step = 0;
  m.world = {{"tp", 1},
             {"pp", 1},
             {"zero_stage", c.engine.zero.stage},
             {"offload_optimizer", offload_device_name(c.engine.zero.offload_optimizer.device)},
             {"offload_param", offload_device_name(c.engine.zero.offload_param.device)}};
  m.optimizer = std::string(optimizer_name(c.engine.optimizer.kind));
  m.states = {"fp32"};
  for (int k = 0; k < c.engine.optimizer.state_arrays(); ++k) m.states.emplace_back(c.engine.optimizer.state_array_name(k));
  const LossScaler scaler(c.engine.compute_dtype == DType::f16 ? c.engine.loss_scaler : LossScalerConfig{.loss_scale = 1.0});
  const auto s = scaler.state();
  m.engine = {{"steps_applied", 0},
              {"steps_run", 0},
              {"compute_dtype", dtype_name(c.engine.compute_dtype)},
              {"loss_scaler",
               {{"scale", s.scale}, {"iteration", s.iteration}, {"last_overflow", s.last_overflow}, {"hysteresis", s.hysteresis}}}};
  m.run = {{"imported_from", from}};
  m.config = c.resolved;
  const ckpt::IoStats io = ckpt::write(
      specs, plan, m,
      [&](size_t tensor, int state, uint64_t lo, uint64_t hi, float* values) {
    if (state == 0) {
      const auto [block, param] = param_of[tensor];
      weights.read(block, param, specs[block].params[param], lo, hi, values);
    } else {
      std::fill(values, values + (hi - lo), 0.0f);  // fresh optimizer state
    }
      },
      out);
  std::printf("imported %s into %s: step 0, %zu tensors, fresh %s state, %s; resume it with `zeroth train %s --resume %s` or start "
              "from its weights with run.init_from\n",
              from.c_str(), io.path.c_str(), param_of.size(), m.optimizer.c_str(), format_bytes(io.bytes).c_str(), config_path.c_str(),
              out.c_str());
}

}  // namespace ckpt_cmd

void add_ckpt_command(CLI::App& app) {
  using namespace ckpt_cmd;
  auto* ckpt = app.add_subcommand("ckpt", "Inspect, verify, export, reshard and import checkpoints");
  ckpt->require_subcommand(1);
  struct Args {
    std::string path, out, dtype = "f32", config, format = "safetensors", shard_size = "5GB";
    int dp = 1;
    bool merge_lora = false;
  };
  auto a = std::make_shared<Args>();
  auto* inspect_cmd =
      ckpt->add_subcommand("inspect", "Print a checkpoint's layout and tensors and verify every file (exit 1 naming any bad file)");
  inspect_cmd->add_option("dir", a->path, "A checkpoint folder (its latest) or a step folder")->required();
  inspect_cmd->callback([a] { inspect(a->path); });
  auto* export_cmd = ckpt->add_subcommand(
      "export",
      "Write a checkpoint's weights in Hugging Face's names and layouts (GPT2LMHeadModel, LlamaForCausalLM, ...): one safetensors "
      "file, or a model folder that from_pretrained loads");
  export_cmd->add_option("dir", a->path, "A checkpoint folder (its latest) or a step folder")->required();
  export_cmd->add_option("--out", a->out, "The .safetensors file, or with --format hf the folder, to write")->required();
  export_cmd->add_option("--format", a->format,
                         "safetensors (default: one file) or hf (a folder: config.json, shards, model.safetensors.index.json)");
  export_cmd->add_option("--max-shard-size", a->shard_size,
                         "With --format hf: the largest shard (default 5GB; a larger tensor alone)");
  export_cmd->add_option("--dtype", a->dtype, "f32 (default), bf16 or f16");
  export_cmd->add_flag("--merge-lora", a->merge_lora,
                       "A LoRA run's checkpoint: write the adapted weights (W + scale B A) instead of the base with PEFT's adapter "
                       "files beside it");
  export_cmd->callback([a] { export_weights(a->path, a->out, a->dtype, a->format, a->shard_size, a->merge_lora); });
  auto* reshard_cmd = ckpt->add_subcommand("reshard", "Rewrite a checkpoint as M data-parallel ranks would have saved it");
  reshard_cmd->add_option("dir", a->path, "A checkpoint folder (its latest) or a step folder")->required();
  reshard_cmd->add_option("--dp", a->dp, "The data-parallel size to write for")->required()->check(CLI::Range(1, 1 << 20));
  reshard_cmd->add_option("--out", a->out, "The checkpoint folder to write (a step folder and latest go in it)")->required();
  reshard_cmd->callback([a] { reshard(a->path, a->dp, a->out); });
  auto* import_cmd = ckpt->add_subcommand(
      "import", "Turn Hugging Face weights (the config's model) into a checkpoint for a config, a tensor at a time");
  import_cmd->add_option("weights", a->path, "A .safetensors file or a Hugging Face model folder (sharded or not)")->required();
  import_cmd->add_option("--config", a->config, "The training config whose model it must fit (model.* keys)")->required();
  import_cmd->add_option("--out", a->out, "The checkpoint folder to write")->required();
  import_cmd->callback([a] { import_weights(a->path, a->config, a->out); });
}

}  // namespace zeroth::tools
