// The model, data, run and parallel sections of a training config.
#include "train/config/sections.h"

#include <algorithm>  // std::all_of

#include <fmt/format.h>  // fmt::format

#include "core/config_section.h"           // ConfigSection, is_auto
#include "core/error.h"                    // ZEROTH_THROW
#include "core/memory.h"                   // parse_bytes
#include "engine/config/deepspeed_keys.h"  // without_deepspeed_extras
#include "train/hf/model_config.h"         // read_hf_config, rope_scaling_from_json
#include "train/text/tokenizer.h"          // Tokenizer

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

void read_model(TrainConfig& t, const json& j, int default_vocab) {
  static constexpr std::string_view kKeys[] = {"preset",
                                               "vocab_size",
                                               "seq_len",
                                               "n_layer",
                                               "n_head",
                                               "n_embd",
                                               "activation_checkpointing",
                                               "chunked_loss",
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
                                               "moe"};
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
    g.seq_len = static_cast<int>(s.integer("seq_len", s.has("preset") ? g.seq_len : 256, 1, 1 << 20));
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
  t.model = g;
  if (s.has("no_weight_decay")) {
    const json& v = s.raw("no_weight_decay");
    if (!v.is_array() || !std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_string(); })) {
      ZEROTH_THROW(ConfigError,
                   "model.no_weight_decay must be a list of roles (weight, bias, norm, embedding) or parameter-name globs like "
                   "\"h.*.attn.*\", got {}",
                   v.dump());
    }
    t.engine.no_weight_decay.exclude = v.get<std::vector<std::string>>();
  }
  t.engine.no_weight_decay.check(Gpt::block_specs(g));
}

void read_data(TrainConfig& t, const json& j) {
  static constexpr std::string_view kKeys[] = {"format", "train", "val", "val_fraction", "vocab_size", "tokens", "tokenizer"};
  static constexpr std::string_view kFormats[] = {"bin", "text", "synthetic"};
  const json section = j.value("data", json::object());
  ConfigSection s(section, "data", kKeys);
  DataConfig d;
  d.tokenizer = s.string("tokenizer", "");
  const std::string f = s.string("format", s.has("tokenizer") ? "text" : s.has("train") ? "bin" : "synthetic", kFormats);
  d.format = f == "bin" ? DataFormat::bin : f == "text" ? DataFormat::text : DataFormat::synthetic;
  d.train = s.string("train", "");
  d.val = s.string("val", "");
  d.val_fraction = s.number("val_fraction", 0.1, 0.0, 0.5);
  if (d.format != DataFormat::synthetic && d.train.empty()) {
    ZEROTH_THROW(ConfigError, "data.train is required for data.format \"{}\" (a path to the training {})", f,
                 d.format == DataFormat::bin ? "token file in llm.c's .bin format" : "text file");
  }
  if (d.format == DataFormat::synthetic && s.has("tokenizer"))
    ZEROTH_THROW(ConfigError, "{} tokenizes text; synthetic data has no text (set data.format to \"text\")", s.at("tokenizer"));
  if (!d.tokenizer.empty()) d.tokenizer_vocab = Tokenizer::open(d.tokenizer)->vocab_size();
  if (d.format == DataFormat::synthetic) {
    if (s.has("train") || s.has("val"))
      ZEROTH_THROW(ConfigError,
                   "data.format \"synthetic\" takes no data.train / data.val paths; set data.format to \"bin\" or \"text\"");
    d.vocab_size = static_cast<int>(s.integer("vocab_size", 256, 2, 65536));
    d.synthetic_tokens = s.integer("tokens", 0, 1024, int64_t{1} << 40);
  } else if (s.has("vocab_size") || s.has("tokens")) {
    ZEROTH_THROW(ConfigError,
                 "data.vocab_size and data.tokens belong to data.format \"synthetic\"; the vocabulary of \"{}\" data is fixed "
                 "(model.vocab_size)",
                 f);
  }
  t.data = d;
}

void read_monitors(TrainConfig& t, const json& j) {
  static constexpr std::string_view kKeys[] = {"enabled", "output_path", "job_name"};
  const auto read = [&](const char* name, MonitorSection& m) {
    if (!j.contains(name) || j[name].is_null()) return;
    if (!j[name].is_object())
      ZEROTH_THROW(ConfigError, "{} must be an object such as {{\"enabled\": true}}, got {}", name, j[name].dump());
    ConfigSection s(j[name], name, kKeys);
    m.enabled = s.flag("enabled", false);
    m.output_path = s.string("output_path", "");
    if (m.output_path.empty()) m.output_path = t.run.output_dir;
    m.job_name = s.string("job_name", m.job_name);
    if (m.job_name.empty() || m.job_name.find('/') != std::string::npos || m.job_name == "." || m.job_name == "..") {
      ZEROTH_THROW(ConfigError, "{}.job_name = \"{}\" must name one folder (not empty, no '/')", name, m.job_name);
    }
  };
  read("tensorboard", t.monitors.tensorboard);
  read("csv_monitor", t.monitors.csv);
}

void read_run(TrainConfig& t, const json& j, int launched_world_size) {
  static constexpr std::string_view kKeys[] = {
      "name",           "steps",       "eval_interval", "eval_batches",     "seed",     "output_dir",          "device",
      "device_memory",  "host_memory", "world_size",    "backend",          "progress", "max_nonfinite_steps", "checkpoint_interval",
      "checkpoint_dir", "keep_last",   "init_from",     "checkpoint_async", "trace",    "sample_tokens"};
  static constexpr std::string_view kBackends[] = {"local", "gloo", "nccl"};
  static constexpr std::string_view kProgress[] = {"auto", "bar", "lines"};
  json copy = j.value("run", json::object());
  const bool world_auto = copy.is_object() && copy.contains("world_size") && is_auto(copy["world_size"]);
  if (world_auto) copy.erase("world_size");
  // "auto" is one of run.progress's own values (its default), not DeepSpeed's placeholder.
  if (copy.is_object() && copy.contains("progress") && is_auto(copy["progress"])) copy.erase("progress");
  // One process under a launcher (zeroth launch -n 1, for its restarts) that asks for local ranks
  // runs them as threads, as it would alone.
  if (launched_world_size == 1 && copy.is_object() && copy.contains("backend") && copy["backend"] == "local") launched_world_size = 0;
  ConfigSection s(copy, "run", kKeys);
  RunConfig r;
  r.name = s.string("name", r.name);
  r.steps = s.integer("steps", r.steps, 1, int64_t{1} << 40);
  r.eval_interval = s.integer("eval_interval", 0, 0, int64_t{1} << 40);
  if (s.has("eval_batches") && s.raw("eval_batches") == "all") r.eval_batches = 0;
  else r.eval_batches = s.integer("eval_batches", r.eval_batches, 1, 1 << 20, "an integer in [1, 1048576] or \"all\"");
  r.seed = static_cast<uint64_t>(s.integer("seed", 1234, 0, int64_t{1} << 53));
  r.output_dir = s.string("output_dir", "runs/" + r.name);
  r.device = s.string("device", "cpu");
  if (r.device != "cpu" && r.device != "cuda" && !r.device.starts_with("cuda:")) {
    ZEROTH_THROW(ConfigError, "run.device = \"{}\" is not one of: cpu, cuda, cuda:N", r.device);
  }
  // Byte sizes: "2GiB" or a number of bytes; absent or 0: unlimited.
  auto bytes = [&](const char* key, size_t& out) {
    if (!s.has(key)) return;
    const auto& v = s.raw(key);
    try {
      out = v.is_number() ? static_cast<size_t>(v.get<double>()) : parse_bytes(v.get<std::string>());
    } catch (const std::exception&) {
      ZEROTH_THROW(ConfigError, "run.{} must be a size like \"2GiB\" or a number of bytes, got {}", key, v.dump());
    }
  };
  bytes("device_memory", r.device_memory);
  bytes("host_memory", r.host_memory);
  r.progress = s.string("progress", "auto", kProgress);
  r.max_nonfinite_steps = s.integer("max_nonfinite_steps", r.max_nonfinite_steps, 0, int64_t{1} << 40);
  r.checkpoint_interval = s.integer("checkpoint_interval", 0, -1, int64_t{1} << 40);
  r.checkpoint_dir = s.string("checkpoint_dir", "");
  if (r.checkpoint_dir.empty()) r.checkpoint_dir = r.output_dir + "/checkpoints";
  r.keep_last = s.integer("keep_last", 0, 0, int64_t{1} << 30);
  r.init_from = s.string("init_from", "");
  r.checkpoint_async = s.flag("checkpoint_async", false);
  r.trace = s.flag("trace", false);
  r.sample_tokens = static_cast<int>(s.integer("sample_tokens", 64, 0, 1 << 20));
  if (launched_world_size > 0) {
    r.world_size = static_cast<int>(s.integer("world_size", launched_world_size, 1, 1 << 20));
    if (r.world_size != launched_world_size) {
      ZEROTH_THROW(ConfigError,
                   "run.world_size = {} but the launcher started {} ranks (WORLD_SIZE); remove run.world_size or make them agree",
                   r.world_size, launched_world_size);
    }
    r.backend = s.string("backend", r.device == "cpu" ? "gloo" : "nccl", kBackends);
    if (r.backend == "local") {
      ZEROTH_THROW(
          ConfigError,
          "run.backend = \"local\" runs ranks as threads of one process, but this process was started by a "
          "launcher of {} ranks; use \"gloo\" (CPU) or \"nccl\" (GPUs), or one process (zeroth launch -n 1) to run them as threads",
          launched_world_size);
    }
  } else {
    r.world_size = static_cast<int>(s.integer("world_size", world_auto ? 1 : r.world_size, 1, 1 << 12));
    r.backend = s.string("backend", "local", kBackends);
    if (r.backend != "local" && r.world_size > 1) {
      ZEROTH_THROW(ConfigError,
                   "run.backend = \"{}\" needs one process per rank: start with `zeroth launch -n {} -- zeroth train ...` (or set "
                   "run.backend to \"local\" for threads)",
                   r.backend, r.world_size);
    }
  }
  t.run = r;
}

// zeroth's `parallel` section and DeepSpeed's `pipeline`: the stages, schedule and partition. The
// data-parallel size is what is left of the world.
void read_parallel(TrainConfig& t, json& j) {
  static constexpr std::string_view kParallelKeys[] = {"tensor",         "sequence_parallel", "pipeline", "schedule",
                                                       "virtual_stages", "micro_batches",     "expert",   "expert_overlap"};
  static constexpr std::string_view kPipelineKeys[] = {"stages",          "partition_method",
                                                       "partition",       "activation_checkpoint_interval",
                                                       "seed_layers",     "pipe_partitioned",
                                                       "grad_partitioned"};
  static constexpr std::string_view kSchedules[] = {"gpipe", "1f1b", "interleaved"};
  ParallelConfig& p = t.parallel;
  json parallel = j.value("parallel", json::object());
  // DeepSpeed's words in the wrong section: say where they go.
  if (parallel.is_object() && parallel.contains("stages"))
    ZEROTH_THROW(ConfigError, "parallel.stages is not a key: the stages are parallel.pipeline (or DeepSpeed's pipeline.stages)");
  if (const auto ds_section = j.value("pipeline", json::object()); ds_section.is_object() && ds_section.contains("micro_batches")) {
    ZEROTH_THROW(ConfigError,
                 "pipeline.micro_batches is not one of DeepSpeed's pipeline keys: the micro-batches are parallel.micro_batches "
                 "(or gradient_accumulation_steps)");
  }
  const ConfigSection par(parallel, "parallel", kParallelKeys);
  json ds = j.value("pipeline", json::object());
  if (ds.is_object() && ds.contains("stages") && is_auto(ds["stages"])) ds.erase("stages");  // DeepSpeed's default
  const ConfigSection pipe(ds, "pipeline", kPipelineKeys);
  p.pipeline = static_cast<int>(par.integer("pipeline", pipe.integer("stages", 1, 1, 1 << 12), 1, 1 << 12));
  if (par.has("pipeline") && pipe.has("stages") && pipe.integer("stages", 1, 1, 1 << 12) != p.pipeline) {
    ZEROTH_THROW(ConfigError, "parallel.pipeline = {} but pipeline.stages = {}; give one, or make them agree", p.pipeline,
                 pipe.raw("stages").dump());
  }
  const std::string kind = par.string("schedule", "1f1b", kSchedules);
  p.schedule = kind == "gpipe" ? PipeKind::gpipe : kind == "interleaved" ? PipeKind::interleaved : PipeKind::one_f_one_b;
  p.virtual_stages = static_cast<int>(par.integer("virtual_stages", p.schedule == PipeKind::interleaved ? 2 : 1, 1, 1 << 10));
  if (p.schedule != PipeKind::interleaved && p.virtual_stages != 1) {
    ZEROTH_THROW(ConfigError, "parallel.virtual_stages = {} needs parallel.schedule = \"interleaved\" (it is \"{}\")",
                 p.virtual_stages, kind);
  }
  if (p.schedule == PipeKind::interleaved && (p.virtual_stages < 2 || p.pipeline < 2)) {
    ZEROTH_THROW(
        ConfigError,
        "parallel.schedule = \"interleaved\" runs parallel.virtual_stages >= 2 model chunks on each of parallel.pipeline >= 2 "
        "stages (it has {} and {}); use \"1f1b\" otherwise",
        p.virtual_stages, p.pipeline);
  }
  const char* method_key = pipe.has("partition_method") ? "partition_method" : "partition";
  if (pipe.has(method_key)) {
    const json& m = pipe.raw(method_key);
    if (m.is_array()) {
      for (const auto& n : m) {
        if (!n.is_number_integer()) ZEROTH_THROW(ConfigError, "pipeline.{} lists layer counts; {} is not one", method_key, n.dump());
        p.partition_counts.push_back(n.get<int>());
      }
      p.partition = "list";
    } else if (m.is_string() && (m == "parameters" || m == "uniform" || m == "best")) {
      // DeepSpeed's config default "best" leaves the choice to the engine: balanced parameters.
      p.partition = m == "uniform" ? "uniform" : "parameters";
    } else {
      ZEROTH_THROW(ConfigError,
                   "pipeline.{} = {}: use \"parameters\" (balance parameter counts), \"uniform\" (equal layer counts) or a list of "
                   "layers per virtual stage",
                   method_key, m.dump());
    }
  }
  const int64_t interval = pipe.integer("activation_checkpoint_interval", 0, 0, 1 << 20);
  if (interval > 1) {
    ZEROTH_THROW(ConfigError,
                 "pipeline.activation_checkpoint_interval = {}: zeroth recomputes every layer (1) or none (0); a GPT layer is its "
                 "checkpointing unit",
                 interval);
  }
  if (interval == 1 && j.contains("model") && j["model"].is_object() && j["model"].value("activation_checkpointing", true) == false) {
    ZEROTH_THROW(ConfigError,
                 "pipeline.activation_checkpoint_interval = 1 recomputes every layer but model.activation_checkpointing is false; "
                 "give one of them");
  }
  if (interval == 1) t.model.activation_checkpointing = true;
  if (pipe.has("seed_layers") && pipe.flag("seed_layers", false)) {
    ZEROTH_THROW(ConfigError,
                 "pipeline.seed_layers = true seeds each layer's initialization by its index; zeroth's parameters are seeded by name "
                 "already (the same values at any partition); remove it");
  }
  p.tensor = static_cast<int>(par.integer("tensor", 1, 1, 1 << 10));
  p.sequence_parallel = par.flag("sequence_parallel", false);
  if (p.sequence_parallel && p.tensor == 1) {
    ZEROTH_THROW(ConfigError,
                 "parallel.sequence_parallel splits the tokens over the tensor-parallel ranks, but parallel.tensor is 1; set "
                 "parallel.tensor, or remove it");
  }
  for (const char* k : {"pipe_partitioned", "grad_partitioned"}) {
    if (!pipe.has(k)) continue;
    t.no_effect.push_back(
        p.tensor == 1 ? fmt::format("pipeline.{}: it splits messages across tensor-parallel ranks, which this run does not have", k)
                      : fmt::format("pipeline.{}: zeroth's stages send each tensor-parallel rank's rows of the activations with "
                                    "parallel.sequence_parallel and whole ones without it",
                                    k));
  }
  if (t.run.world_size % p.pipeline != 0 && p.tensor == 1) {
    ZEROTH_THROW(ConfigError,
                 "run.world_size = {} is not a multiple of the {} pipeline stages (parallel.pipeline, pipeline.stages): the ranks "
                 "are data-parallel x pipeline stages; make run.world_size a multiple of them",
                 t.run.world_size, p.pipeline);
  }
  if (t.run.world_size % (p.pipeline * p.tensor) != 0) {
    ZEROTH_THROW(ConfigError,
                 "run.world_size = {} is not a multiple of the {} pipeline stages (parallel.pipeline, pipeline.stages) x {} "
                 "tensor-parallel ranks (parallel.tensor): the ranks are data-parallel x pipeline stages x tensor-parallel; make "
                 "run.world_size a multiple of {}",
                 t.run.world_size, p.pipeline, p.tensor, p.pipeline * p.tensor);
  }
  if (p.tensor > 1) {
    GptPart check;
    check.tp_ranks = p.tensor;
    Gpt::block_specs(t.model, check);  // heads and vocabulary against tp now, not at the start of training
  }
  p.expert = static_cast<int>(par.integer("expert", 1, 1, 1 << 12));
  p.expert_overlap = par.flag("expert_overlap", true);
  if (p.expert > 1) {
    if (!t.model.moe.enabled()) {
      ZEROTH_THROW(ConfigError,
                   "parallel.expert = {} shares the experts of model.moe out over ranks, but the model has no expert layers; set "
                   "model.moe or remove parallel.expert",
                   p.expert);
    }
    if (t.data_parallel() % p.expert != 0) {
      ZEROTH_THROW(ConfigError,
                   "parallel.expert = {} must divide the data-parallel size, {} (run.world_size {} over pipeline x tensor = {}): the "
                   "experts are shared out over runs of that many data-parallel ranks",
                   p.expert, t.data_parallel(), t.run.world_size, p.pipeline * p.tensor);
    }
    GptPart check;
    check.ep_ranks = p.expert;
    Gpt::block_specs(t.model, check);  // the experts against E now
  }
  // The cycle's micro-batches are the pipeline's: parallel.micro_batches sets
  // gradient_accumulation_steps (DeepSpeed's pipeline engine does the same).
  if (par.has("micro_batches")) {
    const int64_t m = par.integer("micro_batches", 1, 1, 1 << 20);
    if (j.contains("gradient_accumulation_steps") && !is_auto(j["gradient_accumulation_steps"]) &&
        j["gradient_accumulation_steps"] != json(m)) {
      ZEROTH_THROW(ConfigError,
                   "parallel.micro_batches = {} but gradient_accumulation_steps = {}: a pipeline's micro-batches are the accumulation "
                   "steps; give one, or make them agree",
                   m, j["gradient_accumulation_steps"].dump());
    }
    j["gradient_accumulation_steps"] = m;
  }
  if (p.pipeline > 1) t.layers_per_virtual_stage();  // the partition's errors now, not at the start of training
  if (t.run.trace && p.pipeline == 1) {
    ZEROTH_THROW(
        ConfigError,
        "run.trace writes each pipeline stage's timeline; this run has no pipeline (parallel.pipeline = 1): remove it, or set "
        "parallel.pipeline");
  }
}

}  // namespace zeroth
