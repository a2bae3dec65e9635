// Resolution and validation of a training config. The order matters: "auto" values are filled
// in first (they depend on other keys), then each section is read into typed values with its
// key paths in every message, then cross-section rules (the batch triple) are checked.
#include "train/config/train_config.h"

#include <sys/stat.h>  // stat

#include <algorithm>   // std::transform
#include <cctype>      // std::tolower
#include <cmath>       // std::ceil
#include <cerrno>      // errno
#include <cstring>     // std::strerror
#include <fstream>     // std::ifstream
#include <functional>  // std::function
#include <sstream>     // std::stringstream
#include <vector>      // std::vector

#include "core/env.h"                      // env::kRestartCount, env::kJobStarted
#include "core/error.h"                    // ZEROTH_THROW
#include "core/log.h"                      // ZLOG_WARN
#include "engine/checkpoint/format.h"      // ckpt::kLatestName, ckpt::read_manifest
#include "core/config_section.h"           // ConfigSection, is_auto
#include "engine/config/deepspeed_keys.h"  // without_deepspeed_extras
#include "train/hf/model_config.h"         // rope_scaling_to_json
#include "train/config/sections.h"         // read_model, read_data, read_run, read_parallel

namespace zeroth {
namespace {

using json = nlohmann::json;

// The top-level keys zeroth reads; DeepSpeed's others are in engine/config/deepspeed_keys.cc.
constexpr std::string_view kTopKeys[] = {"train_batch_size",
                                         "train_micro_batch_size_per_gpu",
                                         "gradient_accumulation_steps",
                                         "steps_per_print",
                                         "optimizer",
                                         "scheduler",
                                         "fp16",
                                         "bf16",
                                         "bfloat16",
                                         "zero_optimization",
                                         "aio",
                                         "gradient_clipping",
                                         "activation_checkpointing",
                                         "communication_data_type",
                                         "wall_clock_breakdown",
                                         "data_types",
                                         "model",
                                         "data",
                                         "lora",
                                         "run",
                                         "parallel",
                                         "pipeline",
                                         "tensorboard",
                                         "csv_monitor",
                                         "sequence_parallel_size"};

}  // namespace

std::vector<int> TrainConfig::layers_per_virtual_stage() const {
  return partition_layers(model, parallel.pipeline * parallel.virtual_stages, parallel.partition, parallel.partition_counts,
                          parallel.expert);
}

GptPart TrainConfig::part(int stage, int tp_rank, int dp_rank) const {
  GptPart part = parallel.pipeline == 1 ? GptPart{} : GptPart::of_rank(layers_per_virtual_stage(), parallel.pipeline, stage);
  part.tp_rank = tp_rank, part.tp_ranks = parallel.tensor, part.sequence_parallel = parallel.sequence_parallel;
  part.ep_rank = dp_rank % parallel.expert, part.ep_ranks = parallel.expert, part.ep_overlap = parallel.expert_overlap;
  part.sq_rank = dp_rank % parallel.sequence, part.sq_ranks = parallel.sequence;
  part.cp_rank = dp_rank % parallel.context, part.cp_ranks = parallel.context;
  if (parallel.expert > 1) part.ep_group_tokens = static_cast<size_t>(micro_batch_size) * model.seq_len / sample_ranks();
  return part;
}

// Long: every section read under ConfigErrors in dependency order, then the resolved config written out section by
// section; the second half mirrors the first and both work on the one `t`.
TrainConfig TrainConfig::from_json(const json& config, int launched_world_size) {
  if (!config.is_object()) ZEROTH_THROW(ConfigError, "a training config must be a JSON object, got {}", config.type_name());
  TrainConfig t;
  // Every section is read even after a mistake, so one run names them all (core/config_section.h).
  ConfigErrors errors;
  errors.section([&] { without_deepspeed_extras(config, "", kTopKeys, t.no_effect, UnknownKeys::ignore_unless_typo); });
  // Sections that others' "auto" values depend on come first.
  errors.section([&] { read_run(t, config, launched_world_size); });
  errors.section([&] { read_monitors(t, config); });
  errors.section([&] { read_data(t, config); });
  errors.section([&] {
    const int default_vocab = t.data.tokenizer_vocab > 0                                                ? t.data.tokenizer_vocab
                              : t.data.format == DataFormat::text || t.data.format == DataFormat::jsonl ? 256
                              : t.data.format == DataFormat::bin                                        ? 50257
                                                                                                        : t.data.vocab_size;
    read_model(t, config, default_vocab);
    read_lora(t, config);
    check_vocabulary(t);
  });

  json c = config;
  errors.section([&] {
    read_parallel(t, c);
    // Recomputing the layers already trades compute for memory; the LM head's logits, often the
    // largest activation left, follow unless the model section says otherwise. A chunk is sized to
    // the rank's slice of the vocabulary, known once the parallel section is read.
    const json* given = config.contains("model") && config["model"].is_object() && config["model"].contains("chunked_loss")
                            ? &config["model"]["chunked_loss"]
                            : nullptr;
    if (given != nullptr ? given->is_boolean() && given->get<bool>() : t.model.activation_checkpointing) {
      t.model.loss_chunk_rows = t.model.auto_loss_chunk_rows(t.parallel.tensor);
    }
  });
  errors.section([&] { read_batch(t, c); });
  errors.section([&] {
    std::vector<std::string> recorded;  // the no-effect keys were recorded above
    const json own = without_deepspeed_extras(c, "", kTopKeys, recorded, UnknownKeys::ignore_unless_typo);
    const ConfigSection top(own, "", kTopKeys);
    t.steps_per_print = top.integer("steps_per_print", 10, 1, int64_t{1} << 40);
    read_precision(t, c);
    if (c.contains("gradient_clipping")) t.engine.gradient_clipping = top.number("gradient_clipping", 0, 0, 1e30);
  });
  // DeepSpeed without an optimizer section leaves it to the client; here there is no client code,
  // so the default is stated: AdamW, lr 1e-3 (zeroth's OptimizerParams defaults).
  errors.section([&] {
    if (!c.contains("optimizer")) return;
    static constexpr std::string_view kOptimizerKeys[] = {"type", "params"};
    t.engine.optimizer = OptimizerParams::from_deepspeed(
        without_deepspeed_extras(c["optimizer"], "optimizer", kOptimizerKeys, t.no_effect));
  });
  t.engine.schedule.base_lr = t.engine.optimizer.lr;
  errors.section([&] {
    if (c.contains("scheduler"))
      t.engine.schedule = LrSchedule::from_deepspeed(c["scheduler"], t.engine.optimizer.lr,
                                                     t.engine.optimizer.kind != OptimizerKind::sgd);
  });
  errors.section([&] {
    if (c.contains("zero_optimization")) t.engine.zero = ZeroConfig::from_deepspeed(c["zero_optimization"]);
    t.no_effect.insert(t.no_effect.end(), t.engine.zero.no_effect.begin(), t.engine.zero.no_effect.end());
  });
  errors.section([&] {
    if (c.contains("aio")) t.engine.aio = AioConfig::from_deepspeed(c["aio"]);
    t.no_effect.insert(t.no_effect.end(), t.engine.aio.no_effect.begin(), t.engine.aio.no_effect.end());
  });
  errors.section([&] {
    t.engine.seed = t.run.seed;
    t.engine.time_breakdown = c.value("wall_clock_breakdown", false);
    t.engine.host_memory = t.run.host_memory;
    t.engine.device_budget_name = "run.device_memory";
    t.engine.host_budget_name = "run.host_memory";
    t.engine.validate();
    if (const int p = t.parallel.pipeline;
        t.parallel.schedule == PipeKind::interleaved && t.engine.gradient_accumulation_steps % p != 0) {
      const int64_t m = t.engine.gradient_accumulation_steps;
      ZEROTH_THROW(ConfigError,
                   "parallel.schedule = \"interleaved\" runs the micro-batches in groups of the {} stages, but there are {} "
                   "(parallel.micro_batches, gradient_accumulation_steps); make them a multiple of {}, e.g. {}",
                   p, m, p, (m / p + 1) * p);
    }
  });
  errors.raise();

  // The resolved config: what was given, with "auto" filled in and the derived values spelled out.
  drop_default_autos(c);
  c["train_batch_size"] = t.train_batch_size;
  c["train_micro_batch_size_per_gpu"] = t.micro_batch_size;
  c["gradient_accumulation_steps"] = t.engine.gradient_accumulation_steps;
  c["steps_per_print"] = t.steps_per_print;
  c["gradient_clipping"] = t.engine.gradient_clipping;
  c["model"] = {{"vocab_size", t.model.vocab_size}, {"seq_len", t.model.seq_len},
                {"n_layer", t.model.n_layer},       {"n_head", t.model.n_head},
                {"n_embd", t.model.n_embd},         {"activation_checkpointing", t.model.activation_checkpointing}};
  c["model"]["chunked_loss"] = t.model.loss_chunk_rows > 0 ? json(t.model.loss_chunk_rows) : json(false);
  c["model"]["tiled_mlp"] = t.model.mlp_tile_rows > 0 ? json(t.model.mlp_tile_rows) : json(false);
  for (const char* key : {"trainable", "frozen"}) {
    if (config.contains("model") && config["model"].is_object() && config["model"].contains(key))
      c["model"][key] = config["model"][key];
  }
  if (const LoraConfig& l = t.model.lora; l.enabled()) {
    c["lora"] = {{"r", l.r}, {"alpha", l.alpha}, {"dropout", 0.0}, {"target_modules", l.target_modules}, {"use_rslora", l.use_rslora}};
    if (!t.lora_init_from.empty()) c["lora"]["init_from"] = t.lora_init_from;
  }
  if (!t.model_preset.empty()) c["model"]["preset"] = t.model_preset;
  if (t.model.llama()) {
    // Spelled out whole (a model.hf_config's shape too), so a checkpoint's config needs no other file.
    const GptConfig& g = t.model;
    json& m = c["model"];
    m["architecture"] = "llama";
    m["n_kv_head"] = g.kv_heads(), m["head_dim"] = g.head_size(), m["intermediate_size"] = g.ffn();
    m["rms_norm_eps"] = g.norm_eps, m["rope_theta"] = g.rope_theta;
    m["qkv_bias"] = g.qkv_bias, m["attention_bias"] = g.o_bias, m["qk_norm"] = g.qk_norm;
    m["tie_word_embeddings"] = g.tie_word_embeddings;
    if (g.rope_scaling.type != RopeScaling::Type::none) m["rope_scaling"] = rope_scaling_to_json(g.rope_scaling);
    if (g.max_positions != 0) m["max_position_embeddings"] = g.max_positions;
  }
  if (const MoeConfig& e = t.model.moe; e.enabled()) {
    c["model"]["moe"] = {{"num_experts", e.num_experts},
                         {"top_k", e.top_k},
                         {"capacity_factor", e.capacity_factor},
                         {"eval_capacity_factor", e.eval_capacity_factor},
                         {"min_capacity", e.min_capacity},
                         {"drop_tokens", e.drop_tokens},
                         {"normalize_top_k", e.normalize_top_k},
                         {"aux_loss_coef", e.aux_loss_coef},
                         {"z_loss_coef", e.z_loss_coef},
                         {"every", e.every},
                         {"intermediate_size", e.intermediate_size}};
  }
  const char* formats[] = {"bin", "text", "synthetic", "jsonl"};
  c["data"] = {{"format", formats[static_cast<int>(t.data.format)]}};
  if (const DataConfig& d = t.data; d.format == DataFormat::jsonl) {
    const corpus::Fields defaults;
    json fields = json::object();
    for (const auto& [key, mine, def] :
         {std::tuple{"messages", d.fields.messages, defaults.messages}, std::tuple{"prompt", d.fields.prompt, defaults.prompt},
          std::tuple{"completion", d.fields.completion, defaults.completion}, std::tuple{"text", d.fields.text, defaults.text}})
      if (mine != def) fields[key] = mine;
    if (!fields.empty()) c["data"]["fields"] = fields;
    if (d.loss_on != corpus::LossOn::automatic) c["data"]["loss_on"] = corpus::loss_on_name(d.loss_on);
    if (!d.chat_template.empty()) c["data"]["chat_template"] = d.chat_template;
    c["data"]["truncate"] = d.truncate;
    c["data"]["packing"] = d.packing;
  }
  if (t.data.format == DataFormat::synthetic) {
    c["data"]["vocab_size"] = t.data.vocab_size;
    c["data"]["tokens"] = t.data.synthetic_tokens;
  } else {
    c["data"]["train"] = t.data.train;
    if (!t.data.tokenizer.empty()) c["data"]["tokenizer"] = t.data.tokenizer;
    if (!t.data.val.empty()) c["data"]["val"] = t.data.val;
    else c["data"]["val_fraction"] = t.data.val_fraction;
  }
  c["run"] = {{"name", t.run.name},
              {"steps", t.run.steps},
              {"eval_interval", t.run.eval_interval},
              {"eval_batches", t.run.eval_batches > 0 ? json(t.run.eval_batches) : json("all")},
              {"seed", t.run.seed},
              {"output_dir", t.run.output_dir},
              {"device", t.run.device},
              {"device_memory", t.run.device_memory},
              {"host_memory", t.run.host_memory},
              {"world_size", t.run.world_size},
              {"backend", t.run.backend},
              {"progress", t.run.progress},
              {"max_nonfinite_steps", t.run.max_nonfinite_steps},
              {"checkpoint_interval", t.run.checkpoint_interval},
              {"checkpoint_dir", t.run.checkpoint_dir},
              {"keep_last", t.run.keep_last},
              {"init_from", t.run.init_from},
              {"checkpoint_async", t.run.checkpoint_async},
              {"trace", t.run.trace},
              {"sample_tokens", t.run.sample_tokens}};
  if (t.parallel.pipeline > 1) {
    const char* kinds[] = {"gpipe", "1f1b", "interleaved"};
    c["parallel"] = {{"pipeline", t.parallel.pipeline},
                     {"schedule", kinds[static_cast<int>(t.parallel.schedule)]},
                     {"virtual_stages", t.parallel.virtual_stages},
                     {"micro_batches", t.engine.gradient_accumulation_steps}};
  }
  if (t.parallel.tensor > 1) {
    c["parallel"]["tensor"] = t.parallel.tensor;
    c["parallel"]["sequence_parallel"] = t.parallel.sequence_parallel;
  }
  if (t.parallel.sequence > 1) c["parallel"]["sequence"] = t.parallel.sequence;
  if (t.parallel.context > 1) c["parallel"]["context"] = t.parallel.context, c["parallel"]["context_method"] = "ring";
  if (t.parallel.expert > 1) {
    c["parallel"]["expert"] = t.parallel.expert;
    c["parallel"]["expert_overlap"] = t.parallel.expert_overlap;
  }
  t.resolved = std::move(c);
  return t;
}

json read_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) ZEROTH_THROW(IoError, "cannot read config {}: {}", path, std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str(), nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based; turn it into a line and column.
    const std::string s = text.str();
    size_t line = 1, col = 1;
    for (size_t i = 0; i + 1 < e.byte && i < s.size(); ++i) {
      if (s[i] == '\n') ++line, col = 1;
      else ++col;
    }
    // The library's text repeats the place ("[json.exception.parse_error.101] parse error at line 2,
    // column 1: syntax error ..."): what follows its last "column N: " is the news.
    std::string why = e.what();
    if (const size_t at = why.find("column "); at != std::string::npos && why.find(": ", at) != std::string::npos)
      why = why.substr(why.find(": ", at) + 2);
    ZEROTH_THROW(ConfigError, "{}:{}:{}: not valid JSON: {}", path, line, col, why);
  } catch (const json::exception& e) {
    // Valid syntax that JSON for Modern C++ cannot hold: a number past a double's range.
    ZEROTH_THROW(ConfigError, "{}: a value cannot be read: {}", path, e.what());
  }
}

void apply_override(json& config, std::string_view assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    ZEROTH_THROW(ConfigError, "--set \"{}\": expected key.path=value, e.g. zero_optimization.stage=2", assignment);
  }
  const std::string path(assignment.substr(0, eq)), text(assignment.substr(eq + 1));
  json value;
  try {
    value = json::parse(text);
  } catch (const json::parse_error&) {
    value = text;  // a bare word is a string: run.name=demo
  } catch (const json::exception& e) {
    ZEROTH_THROW(ConfigError, "--set \"{}\": the value cannot be read: {}", assignment, e.what());
  }
  json* at = &config;
  std::string walked;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (key.empty()) ZEROTH_THROW(ConfigError, "--set \"{}\": empty key in the path", assignment);
    if (!at->is_object()) {
      ZEROTH_THROW(ConfigError, "--set \"{}\": {} is {}, not an object", assignment, walked, at->dump());
    }
    walked += (walked.empty() ? "" : ".") + key;
    if (dot == std::string::npos) {
      (*at)[key] = value;
      return;
    }
    at = &(*at)[key];
    if (at->is_null()) *at = json::object();
    start = dot + 1;
  }
}

void resume_after_restart(RunConfig& run) {
  const auto restart = env::get_int(env::kRestartCount);
  if (restart.value_or(0) <= 0 || !run.resume.empty()) return;
  const std::string latest = run.checkpoint_dir + "/" + ckpt::kLatestName;
  struct stat st {};
  if (::stat(latest.c_str(), &st) == 0 && st.st_mtime >= env::get_int(env::kJobStarted).value_or(0)) {
    run.resume = run.checkpoint_dir;
  } else {
    ZLOG_WARN("restart {}: this job saved no checkpoint in {} yet, so the run starts again from step 0", *restart, run.checkpoint_dir);
  }
}

std::optional<int64_t> saved_schedule_steps(const TrainConfig& config) {
  if (config.run.resume.empty() || !config.schedule_steps_auto) return std::nullopt;
  const ckpt::Manifest m = ckpt::read_manifest(ckpt::resolve(config.run.resume));
  const json& c = m.config;
  if (!c.contains("scheduler") || !c["scheduler"].is_object() || !c["scheduler"].contains("params")) return std::nullopt;
  const json saved = c["scheduler"]["params"].value("total_num_steps", json());
  if (!saved.is_number_integer() || saved.get<int64_t>() == config.engine.schedule.total_num_steps) return std::nullopt;
  return saved.get<int64_t>();
}

}  // namespace zeroth
