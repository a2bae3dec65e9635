// The model section of a training config: GPT-2, the Llama family and mixture of experts, from keys,
// a preset or a Hugging Face config.json.
#include <algorithm>  // std::all_of
#include <map>        // std::map

#include <fnmatch.h>  // fnmatch

#include <fmt/format.h>  // fmt::format

#include "core/config_section.h"           // ConfigSection, is_auto
#include "core/error.h"                    // ZEROTH_THROW
#include "engine/config/deepspeed_keys.h"  // without_deepspeed_extras
#include "train/config/sections.h"
#include "train/hf/model_config.h"  // read_hf_config, rope_scaling_from_json

namespace zeroth {

using json = nlohmann::json;

// The Llama family's keys (model.architecture "llama"), in Hugging Face's spelling where it has one.
// Without a preset, the defaults are Hugging Face's LlamaConfig's (rms_norm_eps 1e-6, untied head),
// so the same model written as keys or as a config.json trains alike.
void read_llama_keys(const ConfigSection& s, GptConfig& g, bool preset) {
  g.n_kv_head = static_cast<int>(s.integer("n_kv_head", g.n_kv_head, 0, 4096));
  g.head_dim = static_cast<int>(s.integer("head_dim", g.head_dim, 0, 1 << 16));
  g.intermediate_size = static_cast<int>(s.integer("intermediate_size", g.intermediate_size, 0, 1 << 24));
  g.norm_eps = s.number("rms_norm_eps", preset ? g.norm_eps : 1e-6, 1e-12, 1.0);
  g.rope_theta = s.number("rope_theta", g.rope_theta, 1.0, 1e12);
  if (s.has("rope_scaling")) g.rope_scaling = rope_scaling_from_json(s.raw("rope_scaling"), s.at("rope_scaling"));
  // attention_bias: q, k, v and o (Llama's key); qkv_bias: q, k and v only (Qwen2's).
  const bool bias = s.flag("attention_bias", g.o_bias);
  g.qkv_bias = s.flag("qkv_bias", bias || g.qkv_bias);
  g.o_bias = bias;
  g.qk_norm = s.flag("qk_norm", g.qk_norm);
  g.tie_word_embeddings = s.flag("tie_word_embeddings", preset ? g.tie_word_embeddings : false);
  g.max_positions = static_cast<int>(s.integer("max_position_embeddings", g.max_positions, 0, 1 << 24));
  if (g.o_bias && !g.qkv_bias) {
    ZEROTH_THROW(ConfigError,
                 "{} puts biases on q, k, v and o; model.qkv_bias false with it leaves o's alone, which no Hugging Face "
                 "model has: drop one of them",
                 s.at("attention_bias"));
  }
}

// model.moe: the expert layers (GptConfig::moe). With model.hf_config the shape (experts, top_k,
// widths, which layers, renormalisation) is the file's; the training knobs may still be set.
void read_moe(const ConfigSection& model, GptConfig& g, bool from_file) {
  static constexpr std::string_view kKeys[] = {"num_experts",  "top_k",       "capacity_factor",  "eval_capacity_factor",
                                               "min_capacity", "drop_tokens", "normalize_top_k",  "aux_loss_coef",
                                               "z_loss_coef",  "every",       "intermediate_size"};
  if (!model.raw("moe").is_object()) ZEROTH_THROW(ConfigError, "{} must be an object", model.at("moe"));
  ConfigSection s(model.raw("moe"), model.at("moe"), kKeys);
  MoeConfig& m = g.moe;
  if (from_file) {
    for (const char* key : {"num_experts", "top_k", "every", "intermediate_size", "normalize_top_k"}) {
      if (s.has(key)) ZEROTH_THROW(ConfigError, "{} comes from model.hf_config; drop it from the config", s.at(key));
    }
    if (!m.enabled()) {
      ZEROTH_THROW(ConfigError, "{} is set but the model of model.hf_config has no expert layers; drop it", model.at("moe"));
    }
  } else {
    m.num_experts = static_cast<int>(s.integer("num_experts", 8, 1, 1 << 16));
    m.top_k = static_cast<int>(
        s.integer("top_k", 2, 1, m.num_experts, fmt::format("an integer in [1, {}] (num_experts)", m.num_experts)));
    m.every = static_cast<int>(s.integer("every", 1, 1, g.n_layer, fmt::format("an integer in [1, {}] (model.n_layer)", g.n_layer)));
    m.intermediate_size = static_cast<int>(s.integer("intermediate_size", 0, 0, 1 << 24));
    // DeepSpeed's (and GShard's) top-2 and top-k gates renormalise; its top-1 gate keeps the
    // probability, whose gradient is the router's only signal from the output.
    m.normalize_top_k = s.flag("normalize_top_k", m.top_k >= 2);
  }
  m.capacity_factor = s.number("capacity_factor", m.capacity_factor, 1e-3, 1e3);
  m.eval_capacity_factor = s.number("eval_capacity_factor", m.eval_capacity_factor, 1e-3, 1e3);
  m.min_capacity = static_cast<int>(s.integer("min_capacity", m.min_capacity, 0, 1 << 24));
  m.drop_tokens = s.flag("drop_tokens", m.drop_tokens);
  m.aux_loss_coef = s.number("aux_loss_coef", m.aux_loss_coef, 0.0, 1e3);
  m.z_loss_coef = s.number("z_loss_coef", m.z_loss_coef, 0.0, 1e3);
}

// A list of strings at model.<key>, or ConfigError.
std::vector<std::string> string_list(const ConfigSection& s, const char* key, const char* what) {
  const json& v = s.raw(key);
  if (!v.is_array() || !std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_string(); }))
    ZEROTH_THROW(ConfigError, "{} must be a list of {}, got {}", s.at(key), what, v.dump());
  return v.get<std::vector<std::string>>();
}

// model.trainable / model.frozen: globs over Hugging Face's parameter names. A parameter trains
// when it matches `trainable` (every one, without it) and no pattern of `frozen`. Freezing is by
// block (the engine keeps no gradient or optimizer state for a frozen block): a layer with some
// parameters frozen and others not is an error naming both.
void read_frozen(const ConfigSection& s, GptConfig& g) {
  if (!s.has("trainable") && !s.has("frozen")) return;
  const auto trainable = s.has("trainable") ? string_list(s, "trainable", "Hugging Face parameter-name patterns")
                                            : std::vector<std::string>{};
  const auto frozen = s.has("frozen") ? string_list(s, "frozen", "Hugging Face parameter-name patterns") : std::vector<std::string>{};
  g.frozen_blocks.clear();
  const auto specs = Gpt::block_specs(g);
  const auto names = Gpt::hf_params(g);
  auto matches = [](const std::vector<std::string>& globs, const std::string& name) {
    return std::any_of(globs.begin(), globs.end(), [&](const std::string& e) { return fnmatch(e.c_str(), name.c_str(), 0) == 0; });
  };
  for (const auto& [key, globs] : {std::pair{"trainable", &trainable}, std::pair{"frozen", &frozen}}) {
    for (const auto& e : *globs) {
      if (std::none_of(names.begin(), names.end(), [&](const Gpt::HfParam& p) { return matches({e}, p.name); })) {
        ZEROTH_THROW(ConfigError, "{} entry \"{}\" matches no parameter; the model's names are Hugging Face's, such as \"{}\"",
                     s.at(key), e, names.size() > 1 ? names[1].name : names.front().name);
      }
    }
  }
  // Per block: a parameter that trains and one that does not.
  std::map<int, std::pair<std::string, std::string>> seen;
  for (const auto& p : names) {
    const bool trains = (trainable.empty() || matches(trainable, p.name)) && !matches(frozen, p.name);
    (trains ? seen[p.block].first : seen[p.block].second) = p.name;
  }
  for (const auto& [block, pair] : seen) {
    const auto& [trains, still] = pair;
    if (!trains.empty() && !still.empty()) {
      ZEROTH_THROW(ConfigError,
                   "model.trainable / model.frozen train {} but freeze {}: zeroth freezes whole blocks ({} here); train or freeze "
                   "all of its parameters",
                   trains, still, specs[static_cast<size_t>(block)].name);
    }
    if (trains.empty()) g.frozen_blocks.push_back(specs[static_cast<size_t>(block)].name);
  }
  if (g.frozen_blocks.size() == specs.size())
    ZEROTH_THROW(ConfigError, "model.trainable / model.frozen freeze every parameter: nothing would train");
}

// Long: the `model` section key by key, the shape from hf_config or from a preset and keys, then moe, recomputation and
// no_weight_decay; the shape must be whole before g.validate() and the weight-decay check.
void read_model(TrainConfig& t, const json& j, int default_vocab) {
  static constexpr std::string_view kKeys[] = {"preset",
                                               "vocab_size",
                                               "seq_len",
                                               "n_layer",
                                               "n_head",
                                               "n_embd",
                                               "activation_checkpointing",
                                               "chunked_loss",
                                               "tiled_mlp",
                                               "no_weight_decay",
                                               "architecture",
                                               "hf_config",
                                               "n_kv_head",
                                               "head_dim",
                                               "intermediate_size",
                                               "rms_norm_eps",
                                               "rope_theta",
                                               "rope_scaling",
                                               "attention_bias",
                                               "qkv_bias",
                                               "qk_norm",
                                               "tie_word_embeddings",
                                               "max_position_embeddings",
                                               "moe",
                                               "trainable",
                                               "frozen"};
  static constexpr std::string_view kArchitectures[] = {"gpt2", "llama"};
  const json m = j.value("model", json::object());
  json copy = m;
  if (copy.is_object() && copy.contains("vocab_size") && is_auto(copy["vocab_size"])) copy.erase("vocab_size");
  ConfigSection s(copy, "model", kKeys);
  GptConfig g;
  if (s.has("hf_config")) {
    // The shape is the file's: only the run's sequence length (and recomputation) are the config's.
    for (const char* key : {"preset", "architecture", "vocab_size", "n_layer", "n_head", "n_embd", "n_kv_head", "head_dim",
                            "intermediate_size", "rms_norm_eps", "rope_theta", "rope_scaling", "attention_bias", "qkv_bias", "qk_norm",
                            "tie_word_embeddings", "max_position_embeddings"}) {
      if (s.has(key)) {
        ZEROTH_THROW(ConfigError, "{} comes from model.hf_config ({}); drop it from the config", s.at(key), s.string("hf_config", ""));
      }
    }
    const HfModelConfig hf = read_hf_config(s.string("hf_config", ""));
    for (const auto& u : hf.unused) {
      t.no_effect.push_back(fmt::format("model.hf_config: {} (zeroth trains without dropout and has no sequence-summary head)", u));
    }
    g = hf.model;
    if (g.llama()) g.max_positions = hf.max_positions;
    const int cap = hf.max_positions > 0 ? hf.max_positions : 1 << 20;
    g.seq_len = static_cast<int>(s.integer("seq_len", std::min(cap, 1024), 1, cap,
                                           fmt::format("an integer in [1, {}] (the file's max_position_embeddings)", cap)));
    if (hf.sliding_window > 0 && g.seq_len > hf.sliding_window) {
      ZEROTH_THROW(ConfigError,
                   "model.seq_len {} is longer than the sliding window ({}) of {}; zeroth attends to the whole sequence, so train "
                   "with model.seq_len at most {}",
                   g.seq_len, hf.sliding_window, hf.architecture, hf.sliding_window);
    }
  } else {
    if (s.has("preset")) {
      t.model_preset = s.string("preset", "");
      g = GptConfig::preset(t.model_preset);
    }
    const std::string arch = s.string("architecture", g.llama() ? "llama" : "gpt2", kArchitectures);
    g.architecture = arch == "llama" ? Architecture::llama : Architecture::gpt2;
    g.vocab_size = static_cast<int>(s.integer("vocab_size", s.has("preset") && g.llama() ? g.vocab_size : default_vocab, 1, 1 << 24));
    g.seq_len = static_cast<int>(s.integer("seq_len", s.has("preset") ? g.seq_len : 256, 1, GptConfig::kMaxSeqLen));
    g.n_layer = static_cast<int>(s.integer("n_layer", g.n_layer, 1, 4096));
    g.n_head = static_cast<int>(s.integer("n_head", g.n_head, 1, 4096));
    g.n_embd = static_cast<int>(s.integer("n_embd", g.n_embd, 1, 1 << 20));
    if (g.llama()) {
      read_llama_keys(s, g, s.has("preset"));
    } else {
      for (const char* key : {"n_kv_head", "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta", "rope_scaling",
                              "attention_bias", "qkv_bias", "qk_norm", "tie_word_embeddings", "max_position_embeddings"}) {
        if (s.has(key)) {
          ZEROTH_THROW(ConfigError, "{} belongs to the Llama family; GPT-2 has no such setting (set model.architecture to \"llama\")",
                       s.at(key));
        }
      }
    }
  }
  if (s.has("moe")) read_moe(s, g, s.has("hf_config"));
  // DeepSpeed's activation_checkpointing section turns it on unless the model section says otherwise.
  g.activation_checkpointing = s.flag("activation_checkpointing", j.contains("activation_checkpointing"));
  // A count is taken here; true, and unset (following activation checkpointing), are sized in
  // from_json once every section has had its say (the tensor-parallel split sizes a chunk).
  if (s.has("chunked_loss")) {
    if (const json& v = s.raw("chunked_loss"); v.is_boolean()) {
      g.loss_chunk_rows = 0;
    } else {
      g.loss_chunk_rows = static_cast<int>(
          s.integer("chunked_loss", 0, 1, 1 << 24, "true (chunks sized to the vocabulary), false, or a count of tokens per chunk"));
    }
  }
  // ALST's tiles: as many as the window has multiples of the hidden width (a tile's up-projection
  // output then holds as many floats as a few of the residual stream's rows do).
  if (s.has("tiled_mlp")) {
    if (const json& v = s.raw("tiled_mlp"); v.is_boolean()) {
      g.mlp_tile_rows = v.get<bool>() ? g.n_embd : 0;
    } else {
      g.mlp_tile_rows = static_cast<int>(
          s.integer("tiled_mlp", 0, 1, 1 << 24, "true (tiles of n_embd rows), false, or rows per tile"));
    }
  }
  if (j.contains("activation_checkpointing")) {
    // The section's presence turns checkpointing on; cpu_checkpointing is its one key with an
    // effect, the others are in the vocabulary table.
    static constexpr std::string_view kCheckpointKeys[] = {"cpu_checkpointing"};
    if (!j["activation_checkpointing"].is_object()) ZEROTH_THROW(ConfigError, "activation_checkpointing must be an object");
    const json rest = without_deepspeed_extras(j["activation_checkpointing"], "activation_checkpointing", kCheckpointKeys,
                                               t.no_effect);
    g.cpu_checkpointing = ConfigSection(rest, "activation_checkpointing", kCheckpointKeys).flag("cpu_checkpointing", false);
  }
  g.validate();
  read_frozen(s, g);
  t.model = g;
  if (s.has("no_weight_decay")) {
    t.engine.no_weight_decay.exclude =
        string_list(s, "no_weight_decay", "roles (weight, bias, norm, embedding) or parameter-name globs like \"h.*.attn.*\"");
  }
  t.engine.no_weight_decay.check(Gpt::block_specs(g));
}

void read_lora(TrainConfig& t, const json& j) {
  if (!j.contains("lora")) return;
  static constexpr std::string_view kKeys[] = {"r", "alpha", "dropout", "target_modules", "use_rslora", "init_from"};
  if (!j["lora"].is_object()) ZEROTH_THROW(ConfigError, "lora must be an object, got {}", j["lora"].dump());
  const ConfigSection s(j["lora"], "lora", kKeys);
  LoraConfig& l = t.model.lora;
  l.r = static_cast<int>(s.integer("r", 8, 1, 1 << 16));
  l.alpha = s.number("alpha", 8, 1e-6, 1e6);
  l.use_rslora = s.flag("use_rslora", false);
  if (s.number("dropout", 0, 0, 1) != 0) {
    ZEROTH_THROW(ConfigError,
                 "{} = {}: zeroth trains without dropout, the adapters' input included; set it to 0 (LoRA's own regularizer is its "
                 "rank)",
                 s.at("dropout"), s.raw("dropout").dump());
  }
  l.target_modules = s.has("target_modules")
                         ? string_list(s, "target_modules", "module names (q_proj, v_proj, ...; c_attn for GPT-2) or \"all-linear\"")
                     : t.model.llama() ? std::vector<std::string>{"q_proj", "v_proj"}  // PEFT's defaults
                                       : std::vector<std::string>{"c_attn"};
  if (l.target_modules.empty()) ZEROTH_THROW(ConfigError, "{} is empty: name the linear layers to adapt", s.at("target_modules"));
  t.lora_init_from = s.string("init_from", "");
  if (!t.model.frozen_blocks.empty() ||
      (j.contains("model") && j["model"].is_object() && (j["model"].contains("trainable") || j["model"].contains("frozen")))) {
    ZEROTH_THROW(ConfigError,
                 "lora trains its adapters alone (every base parameter frozen); model.trainable / model.frozen with it would train "
                 "base blocks PEFT's adapter files cannot hold: drop them");
  }
  Gpt::block_specs(t.model);  // ConfigError naming a target the model lacks
}

void check_vocabulary(const TrainConfig& t) {
  if (t.data.tokenizer_vocab > t.model.vocab_size) {
    ZEROTH_THROW(ConfigError, "data.tokenizer {} has {} tokens but model.vocab_size is {}: every token id must have an embedding row",
                 t.data.tokenizer, t.data.tokenizer_vocab, t.model.vocab_size);
  }
  if (t.data.format == DataFormat::synthetic && t.model.vocab_size < t.data.vocab_size) {
    ZEROTH_THROW(ConfigError, "model.vocab_size ({}) is smaller than data.vocab_size ({}): every token id must have an embedding row",
                 t.model.vocab_size, t.data.vocab_size);
  }
  if ((t.data.format == DataFormat::text || t.data.format == DataFormat::jsonl) && t.data.tokenizer.empty() &&
      t.model.vocab_size < 256) {
    ZEROTH_THROW(ConfigError, "model.vocab_size ({}) is smaller than 256, but text without data.tokenizer has one token per byte",
                 t.model.vocab_size);
  }
}

}  // namespace zeroth
