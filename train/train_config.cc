// Resolution and validation of a training config. The order matters: "auto" values are filled
// in first (they depend on other keys), then each section is read into typed values with its
// key paths in every message, then cross-section rules (the batch triple) are checked.
#include "train/train_config.h"

#include <algorithm>   // std::find, std::all_of
#include <cctype>      // std::tolower
#include <cerrno>      // errno
#include <cmath>       // std::floor
#include <cstring>     // std::strerror
#include <fstream>     // std::ifstream
#include <functional>  // std::function
#include <span>        // std::span
#include <sstream>     // std::stringstream
#include <vector>      // std::vector

#include "core/error.h"             // ZEROTH_THROW
#include "core/memory.h"            // parse_bytes
#include "core/strings.h"           // did_you_mean
#include "engine/deepspeed_keys.h"  // handle_deepspeed_key

namespace zeroth {
namespace {

using json = nlohmann::json;

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// One object of the config: unknown keys are errors, typed getters name the key path.
class Section {
 public:
  Section(const json& j, std::string path, std::span<const std::string_view> keys) : j_(j), path_(std::move(path)) {
    if (!j_.is_object()) ZEROTH_THROW(ConfigError, "{} must be an object, got {}", path_, j_.dump());
    for (const auto& [key, v] : j_.items()) {
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
        ZEROTH_THROW(ConfigError, "{} is not a known key{}", at(key), did_you_mean(key, keys));
      }
      if (is_auto(v)) ZEROTH_THROW(ConfigError, "{} is \"auto\", which zeroth cannot resolve for this key; give a value", at(key));
    }
  }
  std::string at(std::string_view key) const { return path_.empty() ? std::string(key) : path_ + "." + std::string(key); }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  const json& raw(const char* key) const { return j_[key]; }

  int64_t integer(const char* key, int64_t def, int64_t lo, int64_t hi) const {
    if (!has(key)) return def;
    const auto& v = j_[key];
    if (!v.is_number() || std::floor(v.get<double>()) != v.get<double>()) {
      ZEROTH_THROW(ConfigError, "{} must be an integer in [{}, {}], got {}", at(key), lo, hi, v.dump());
    }
    const double d = v.get<double>();
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi)) {
      ZEROTH_THROW(ConfigError, "{} must be an integer in [{}, {}], got {}", at(key), lo, hi, v.dump());
    }
    return static_cast<int64_t>(d);
  }
  double number(const char* key, double def, double lo, double hi) const {
    if (!has(key)) return def;
    const auto& v = j_[key];
    if (!v.is_number() || v.get<double>() < lo || v.get<double>() > hi) {
      ZEROTH_THROW(ConfigError, "{} must be a number in [{}, {}], got {}", at(key), lo, hi, v.dump());
    }
    return v.get<double>();
  }
  bool flag(const char* key, bool def) const {
    if (!has(key)) return def;
    if (!j_[key].is_boolean()) ZEROTH_THROW(ConfigError, "{} must be true or false, got {}", at(key), j_[key].dump());
    return j_[key].get<bool>();
  }
  std::string string(const char* key, std::string def, std::span<const std::string_view> choices = {}) const {
    if (!has(key)) return def;
    const auto& v = j_[key];
    if (!v.is_string()) ZEROTH_THROW(ConfigError, "{} must be a string, got {}", at(key), v.dump());
    std::string s = v.get<std::string>();
    if (!choices.empty() && std::find(choices.begin(), choices.end(), s) == choices.end()) {
      std::string list;
      for (auto c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
      ZEROTH_THROW(ConfigError, "{} = \"{}\" is not one of: {}{}", at(key), s, list, did_you_mean(s, choices));
    }
    return s;
  }

 private:
  const json& j_;
  std::string path_;
};

// The top-level keys zeroth reads; DeepSpeed's others are in engine/deepspeed_keys.cc.
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
                                         "run",
                                         "parallel",
                                         "pipeline"};

// `section` without the keys DeepSpeed's vocabulary table handles (which throws for those asking
// for what zeroth lacks, and records those with no effect), so the section's own parser sees only
// the keys it reads. A key in neither is a typo: "not a known key", with a suggestion from both.
json without_deepspeed_extras(const json& section, std::string_view path, std::span<const std::string_view> own,
                              std::vector<std::string>& no_effect) {
  if (!section.is_object()) return section;
  json rest = json::object();
  for (const auto& [key, v] : section.items()) {
    if (std::find(own.begin(), own.end(), key) != own.end()) {
      rest[key] = v;
    } else if (!handle_deepspeed_key(path, key, v, &no_effect)) {
      std::vector<std::string_view> known(own.begin(), own.end());
      for (auto k : deepspeed_key_names(path)) known.push_back(k);
      ZEROTH_THROW(ConfigError, "{}{} is not a known key{}{}", path.empty() ? "" : std::string(path) + ".", key,
                   did_you_mean(key, known),
                   path.empty()
                       ? " (DeepSpeed ignores top-level keys it does not know; zeroth refuses them, so a typo cannot pass unnoticed)"
                       : "");
    }
  }
  return rest;
}

// The Hugging Face integration's "auto" rules, with its TrainingArguments defaults where the
// value comes from the trainer, and with this config's own values where it has them.
void resolve_auto(json& c, int dp, int64_t steps, int hidden) {
  auto fill = [](json& obj, const char* key, const json& value) {
    if (obj.is_object() && obj.contains(key) && is_auto(obj[key])) obj[key] = value;
  };
  fill(c, "train_micro_batch_size_per_gpu", 8);  // per_device_train_batch_size
  fill(c, "gradient_accumulation_steps", 1);
  if (c.contains("train_batch_size") && is_auto(c["train_batch_size"])) {
    // train_batch_size = data-parallel ranks x micro x accumulation, once those two are known.
    const json mb = c.value("train_micro_batch_size_per_gpu", json(1)), gas = c.value("gradient_accumulation_steps", json(1));
    if (mb.is_number_integer() && gas.is_number_integer()) c["train_batch_size"] = dp * mb.get<int64_t>() * gas.get<int64_t>();
  }
  fill(c, "gradient_clipping", 1.0);  // max_grad_norm
  for (const char* k : {"fp16", "bf16", "bfloat16"}) {
    if (c.contains(k)) fill(c[k], "enabled", false);  // HF: the trainer's --fp16 / --bf16 flags, off by default
  }
  double lr = 5e-5;  // learning_rate
  if (c.contains("optimizer") && c["optimizer"].contains("params")) {
    json& p = c["optimizer"]["params"];
    fill(p, "lr", lr);
    fill(p, "betas", json::array({0.9, 0.999}));
    fill(p, "eps", 1e-8);
    fill(p, "weight_decay", 0.0);
    if (p.contains("lr") && p["lr"].is_number()) lr = p["lr"].get<double>();
  }
  if (c.contains("scheduler") && c["scheduler"].contains("params")) {
    json& p = c["scheduler"]["params"];
    fill(p, "warmup_min_lr", 0.0);
    fill(p, "warmup_max_lr", lr);
    fill(p, "warmup_num_steps", 0);  // HF's warmup_steps / warmup_ratio default to 0
    fill(p, "total_num_steps", steps);
  }
  if (c.contains("zero_optimization")) {
    json& z = c["zero_optimization"];
    const int64_t h2 = static_cast<int64_t>(hidden) * hidden;
    fill(z, "reduce_bucket_size", h2);
    fill(z, "stage3_prefetch_bucket_size", static_cast<int64_t>(0.9 * static_cast<double>(h2)));
    fill(z, "stage3_param_persistence_threshold", 10 * static_cast<int64_t>(hidden));
  }
  // The "auto" values Hugging Face leaves in these sections, DeepSpeed's config models drop, so
  // the keys take DeepSpeed's defaults (DeepSpeedConfigModel.__init__).
  std::function<void(json&)> drop_auto = [&](json& obj) {
    if (!obj.is_object()) return;
    for (auto it = obj.begin(); it != obj.end();) {
      if (is_auto(*it)) {
        it = obj.erase(it);
      } else {
        drop_auto(*it);
        ++it;
      }
    }
  };
  for (const char* k : {"zero_optimization", "fp16", "bf16", "bfloat16"}) {
    if (c.contains(k)) drop_auto(c[k]);
  }
}

DType parse_comm_dtype(std::string s) {
  // DeepSpeed lower-cases the value; "bfp16" is its older spelling of bf16.
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (s == "fp32" || s == "float32") return DType::f32;
  if (s == "bf16" || s == "bfloat16" || s == "bfp16") return DType::bf16;
  if (s == "fp16" || s == "float16") return DType::f16;
  ZEROTH_THROW(ConfigError, "communication_data_type = \"{}\" is not one of: fp32, bf16, fp16", s);
}

void read_model(TrainConfig& t, const json& j, int default_vocab) {
  static constexpr std::string_view kKeys[] = {
      "preset", "vocab_size", "seq_len", "n_layer", "n_head", "n_embd", "activation_checkpointing", "no_weight_decay"};
  const json m = j.value("model", json::object());
  json copy = m;
  if (copy.is_object() && copy.contains("vocab_size") && is_auto(copy["vocab_size"])) copy.erase("vocab_size");
  Section s(copy, "model", kKeys);
  GptConfig g;
  if (s.has("preset")) {
    t.model_preset = s.string("preset", "");
    g = GptConfig::preset(t.model_preset);
  }
  g.vocab_size = static_cast<int>(s.integer("vocab_size", default_vocab, 1, 1 << 24));
  g.seq_len = static_cast<int>(s.integer("seq_len", s.has("preset") ? g.seq_len : 256, 1, 1 << 20));
  g.n_layer = static_cast<int>(s.integer("n_layer", g.n_layer, 1, 4096));
  g.n_head = static_cast<int>(s.integer("n_head", g.n_head, 1, 4096));
  g.n_embd = static_cast<int>(s.integer("n_embd", g.n_embd, 1, 1 << 20));
  // DeepSpeed's activation_checkpointing section turns it on unless the model section says otherwise.
  g.activation_checkpointing = s.flag("activation_checkpointing", j.contains("activation_checkpointing"));
  if (j.contains("activation_checkpointing")) {
    // The section's presence turns checkpointing on; cpu_checkpointing is its one key with an
    // effect, the others are in the vocabulary table.
    static constexpr std::string_view kCheckpointKeys[] = {"cpu_checkpointing"};
    if (!j["activation_checkpointing"].is_object()) ZEROTH_THROW(ConfigError, "activation_checkpointing must be an object");
    const json rest = without_deepspeed_extras(j["activation_checkpointing"], "activation_checkpointing", kCheckpointKeys,
                                               t.no_effect);
    g.cpu_checkpointing = Section(rest, "activation_checkpointing", kCheckpointKeys).flag("cpu_checkpointing", false);
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
  static constexpr std::string_view kKeys[] = {"format", "train", "val", "val_fraction", "vocab_size", "tokens"};
  static constexpr std::string_view kFormats[] = {"bin", "text", "synthetic"};
  const json section = j.value("data", json::object());
  Section s(section, "data", kKeys);
  DataConfig d;
  const std::string f = s.string("format", s.has("train") ? "bin" : "synthetic", kFormats);
  d.format = f == "bin" ? DataFormat::bin : f == "text" ? DataFormat::text : DataFormat::synthetic;
  d.train = s.string("train", "");
  d.val = s.string("val", "");
  d.val_fraction = s.number("val_fraction", 0.1, 0.0, 0.5);
  if (d.format != DataFormat::synthetic && d.train.empty()) {
    ZEROTH_THROW(ConfigError, "data.train is required for data.format \"{}\" (a path to the training {})", f,
                 d.format == DataFormat::bin ? "token file in llm.c's .bin format" : "text file");
  }
  if (d.format == DataFormat::synthetic) {
    if (s.has("train") || s.has("val"))
      ZEROTH_THROW(ConfigError,
                   "data.format \"synthetic\" takes no data.train / data.val paths; set data.format to \"bin\" or \"text\"");
    d.vocab_size = static_cast<int>(s.integer("vocab_size", 256, 2, 65536));
    d.synthetic_tokens = s.integer("tokens", 1 << 20, 1024, int64_t{1} << 40);
  } else if (s.has("vocab_size") || s.has("tokens")) {
    ZEROTH_THROW(ConfigError,
                 "data.vocab_size and data.tokens belong to data.format \"synthetic\"; the vocabulary of \"{}\" data is fixed "
                 "(model.vocab_size)",
                 f);
  }
  t.data = d;
}

void read_run(TrainConfig& t, const json& j, int launched_world_size) {
  static constexpr std::string_view kKeys[] = {
      "name",           "steps",       "eval_interval", "eval_batches",     "seed",     "output_dir",          "device",
      "device_memory",  "host_memory", "world_size",    "backend",          "progress", "max_nonfinite_steps", "checkpoint_interval",
      "checkpoint_dir", "keep_last",   "init_from",     "checkpoint_async", "trace"};
  static constexpr std::string_view kBackends[] = {"local", "gloo", "nccl"};
  static constexpr std::string_view kProgress[] = {"auto", "bar", "lines"};
  json copy = j.value("run", json::object());
  const bool world_auto = copy.is_object() && copy.contains("world_size") && is_auto(copy["world_size"]);
  if (world_auto) copy.erase("world_size");
  // "auto" is one of run.progress's own values (its default), not DeepSpeed's placeholder.
  if (copy.is_object() && copy.contains("progress") && is_auto(copy["progress"])) copy.erase("progress");
  Section s(copy, "run", kKeys);
  RunConfig r;
  r.name = s.string("name", r.name);
  r.steps = s.integer("steps", r.steps, 1, int64_t{1} << 40);
  r.eval_interval = s.integer("eval_interval", 0, 0, int64_t{1} << 40);
  r.eval_batches = s.integer("eval_batches", r.eval_batches, 1, 1 << 20);
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
  if (launched_world_size > 0) {
    r.world_size = static_cast<int>(s.integer("world_size", launched_world_size, 1, 1 << 20));
    if (r.world_size != launched_world_size) {
      ZEROTH_THROW(ConfigError,
                   "run.world_size = {} but the launcher started {} ranks (WORLD_SIZE); remove run.world_size or make them agree",
                   r.world_size, launched_world_size);
    }
    r.backend = s.string("backend", r.device == "cpu" ? "gloo" : "nccl", kBackends);
    if (r.backend == "local") {
      ZEROTH_THROW(ConfigError, "run.backend = \"local\" runs ranks as threads of one process, but this process was started by a "
                                "launcher; use \"gloo\" (CPU) or \"nccl\" (GPUs)");
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
  static constexpr std::string_view kParallelKeys[] = {"tensor",   "sequence_parallel", "pipeline",
                                                       "schedule", "virtual_stages",    "micro_batches"};
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
  const Section par(parallel, "parallel", kParallelKeys);
  json ds = j.value("pipeline", json::object());
  if (ds.is_object() && ds.contains("stages") && is_auto(ds["stages"])) ds.erase("stages");  // DeepSpeed's default
  const Section pipe(ds, "pipeline", kPipelineKeys);
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

// DeepSpeed's batch rule: train_batch_size = micro x accumulation x data-parallel ranks, any two
// give the third.
void resolve_batch(TrainConfig& t, const json& j) {
  auto get = [&](const char* key) -> int64_t {
    if (!j.contains(key) || j[key].is_null()) return 0;
    const auto& v = j[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 1)
      ZEROTH_THROW(ConfigError, "{} must be a positive integer, got {}", key, v.dump());
    return v.get<int64_t>();
  };
  int64_t tbs = get("train_batch_size"), mb = get("train_micro_batch_size_per_gpu"), gas = get("gradient_accumulation_steps");
  const int64_t dp = t.data_parallel();
  if (tbs && mb && gas) {
    // all given: checked below
  } else if (tbs && mb) {
    if (tbs % (mb * dp) != 0) {
      ZEROTH_THROW(ConfigError,
                   "train_batch_size ({}) is not a multiple of train_micro_batch_size_per_gpu ({}) x data-parallel ranks ({}) = {}, "
                   "so gradient_accumulation_steps cannot be derived",
                   tbs, mb, dp, mb * dp);
    }
    gas = tbs / (mb * dp);
  } else if (tbs && gas) {
    if (tbs % (gas * dp) != 0) {
      ZEROTH_THROW(ConfigError,
                   "train_batch_size ({}) is not a multiple of gradient_accumulation_steps ({}) x data-parallel ranks ({}) = {}, so "
                   "train_micro_batch_size_per_gpu cannot be derived",
                   tbs, gas, dp, gas * dp);
    }
    mb = tbs / (gas * dp);
  } else if (mb && gas) {
    tbs = mb * gas * dp;
  } else if (tbs) {
    if (tbs % dp != 0) ZEROTH_THROW(ConfigError, "train_batch_size ({}) is not a multiple of the data-parallel ranks ({})", tbs, dp);
    gas = 1;
    mb = tbs / dp;
  } else if (mb) {
    gas = 1;
    tbs = mb * dp;
  } else {
    ZEROTH_THROW(ConfigError, "the batch size is not set: give train_micro_batch_size_per_gpu (sequences per rank per micro-step) "
                              "and/or train_batch_size (sequences per optimizer step)");
  }
  if (mb < 1 || gas < 1 || tbs != mb * gas * dp) {
    ZEROTH_THROW(ConfigError,
                 "train_batch_size ({}) must equal train_micro_batch_size_per_gpu ({}) x gradient_accumulation_steps ({}) x "
                 "data-parallel ranks ({}) = {}",
                 tbs, mb, gas, dp, mb * gas * dp);
  }
  t.train_batch_size = tbs;
  t.micro_batch_size = mb;
  t.engine.gradient_accumulation_steps = gas;
}

// The sections of DeepSpeed's that zeroth reads only in part.
void check_deepspeed_extras(json& j) {
  if (j.contains("wall_clock_breakdown") && !j["wall_clock_breakdown"].is_boolean()) {
    ZEROTH_THROW(ConfigError, "wall_clock_breakdown must be true or false, got {}", j["wall_clock_breakdown"].dump());
  }
  if (j.contains("data_types")) {
    static constexpr std::string_view kKeys[] = {"grad_accum_dtype", "param_dtype", "buffer_dtype"};
    Section s(j["data_types"], "data_types", kKeys);
    const std::string g = s.string("grad_accum_dtype", "fp32");
    if (g != "fp32") ZEROTH_THROW(ConfigError, "data_types.grad_accum_dtype = \"{}\": zeroth accumulates gradients in fp32 only", g);
    for (const char* k : {"param_dtype", "buffer_dtype"}) {
      if (s.has(k) && !s.raw(k).is_null()) {
        ZEROTH_THROW(ConfigError,
                     "data_types.{} = {} is a DeepSpeed feature zeroth does not support (parameters in another dtype than the compute "
                     "precision); remove it",
                     k, s.raw(k).dump());
      }
    }
  }
}

void read_precision(TrainConfig& t, const json& j) {
  static constexpr std::string_view kBf16Keys[] = {"enabled"};
  const char* bf16_key = j.contains("bf16") ? "bf16" : "bfloat16";
  bool fp16 = false, bf16 = false;
  if (j.contains(bf16_key)) {
    // bfloat16 is DeepSpeed's old name of the same section.
    const json rest = without_deepspeed_extras(j[bf16_key], bf16_key, kBf16Keys, t.no_effect);
    const Section s(rest, bf16_key, kBf16Keys);
    bf16 = s.flag("enabled", false);
  }
  if (j.contains("fp16")) {
    if (!j["fp16"].is_object()) ZEROTH_THROW(ConfigError, "fp16 must be an object like {{\"enabled\": true}}");
    const json f = without_deepspeed_extras(j["fp16"], "fp16", LossScalerConfig::kDeepSpeedKeys, t.no_effect);
    if (f.contains("enabled") && !f["enabled"].is_boolean())
      ZEROTH_THROW(ConfigError, "fp16.enabled must be true, false or \"auto\", got {}", f["enabled"].dump());
    fp16 = f.value("enabled", false);
    t.engine.loss_scaler = LossScalerConfig::from_deepspeed(f);
  }
  if (fp16 && bf16) ZEROTH_THROW(ConfigError, "fp16.enabled and {}.enabled are both true; choose one precision", bf16_key);
  t.engine.compute_dtype = bf16 ? DType::bf16 : fp16 ? DType::f16 : DType::f32;
  // DeepSpeed's engine reduces in the gradients' dtype unless communication_data_type says
  // otherwise (DeepSpeedEngine.communication_data_type: fp16, else bf16, else fp32).
  t.engine.communication_dtype = t.engine.compute_dtype;
  if (j.contains("communication_data_type") && !j["communication_data_type"].is_null()) {
    if (!j["communication_data_type"].is_string())
      ZEROTH_THROW(ConfigError, "communication_data_type must be \"fp32\", \"bf16\" or \"fp16\"");
    t.engine.communication_dtype = parse_comm_dtype(j["communication_data_type"].get<std::string>());
  }
}

}  // namespace

std::vector<int> TrainConfig::layers_per_virtual_stage() const {
  return partition_layers(model, parallel.pipeline * parallel.virtual_stages, parallel.partition, parallel.partition_counts);
}

GptPart TrainConfig::part(int stage, int tp_rank) const {
  GptPart part = parallel.pipeline == 1 ? GptPart{} : GptPart::of_rank(layers_per_virtual_stage(), parallel.pipeline, stage);
  part.tp_rank = tp_rank, part.tp_ranks = parallel.tensor, part.sequence_parallel = parallel.sequence_parallel;
  return part;
}

TrainConfig TrainConfig::from_json(const json& config, int launched_world_size) {
  if (!config.is_object()) ZEROTH_THROW(ConfigError, "a training config must be a JSON object, got {}", config.type_name());
  TrainConfig t;
  without_deepspeed_extras(config, "", kTopKeys, t.no_effect);
  // Sections that others' "auto" values depend on come first.
  read_run(t, config, launched_world_size);
  read_data(t, config);
  const int default_vocab = t.data.format == DataFormat::text ? 256 : t.data.format == DataFormat::bin ? 50257 : t.data.vocab_size;
  read_model(t, config, default_vocab);
  if (t.data.format == DataFormat::synthetic && t.model.vocab_size < t.data.vocab_size) {
    ZEROTH_THROW(ConfigError, "model.vocab_size ({}) is smaller than data.vocab_size ({}): every token id must have an embedding row",
                 t.model.vocab_size, t.data.vocab_size);
  }
  if (t.data.format == DataFormat::text && t.model.vocab_size < 256) {
    ZEROTH_THROW(ConfigError, "model.vocab_size ({}) is smaller than 256, but text data has one token per byte", t.model.vocab_size);
  }

  json c = config;
  read_parallel(t, c);
  resolve_auto(c, t.data_parallel(), t.run.steps, t.model.n_embd);
  check_deepspeed_extras(c);
  resolve_batch(t, c);
  if (const int tp = t.parallel.tensor; t.parallel.sequence_parallel && (t.micro_batch_size * t.model.seq_len) % tp != 0) {
    ZEROTH_THROW(ConfigError,
                 "parallel.sequence_parallel splits each micro-batch's {} x {} = {} tokens (train_micro_batch_size_per_gpu x "
                 "model.seq_len) over the {} tensor-parallel ranks; make the count a multiple of {}",
                 t.micro_batch_size, t.model.seq_len, t.micro_batch_size * t.model.seq_len, tp, tp);
  }
  std::vector<std::string> recorded;  // the no-effect keys were recorded above
  const json own = without_deepspeed_extras(c, "", kTopKeys, recorded);
  const Section top(own, "", kTopKeys);
  t.steps_per_print = top.integer("steps_per_print", 10, 1, int64_t{1} << 40);
  read_precision(t, c);
  if (c.contains("gradient_clipping")) t.engine.gradient_clipping = top.number("gradient_clipping", 0, 0, 1e30);

  // DeepSpeed without an optimizer section leaves it to the client; here there is no client code,
  // so the default is stated: AdamW, lr 1e-3 (zeroth's OptimizerParams defaults).
  if (c.contains("optimizer")) {
    static constexpr std::string_view kOptimizerKeys[] = {"type", "params"};
    t.engine.optimizer = OptimizerParams::from_deepspeed(
        without_deepspeed_extras(c["optimizer"], "optimizer", kOptimizerKeys, t.no_effect));
  }
  t.engine.schedule.base_lr = t.engine.optimizer.lr;
  if (c.contains("scheduler"))
    t.engine.schedule = LrSchedule::from_deepspeed(c["scheduler"], t.engine.optimizer.lr,
                                                   t.engine.optimizer.kind != OptimizerKind::sgd);
  if (c.contains("zero_optimization")) t.engine.zero = ZeroConfig::from_deepspeed(c["zero_optimization"]);
  t.no_effect.insert(t.no_effect.end(), t.engine.zero.no_effect.begin(), t.engine.zero.no_effect.end());
  if (c.contains("aio")) t.engine.aio = AioConfig::from_deepspeed(c["aio"]);
  t.no_effect.insert(t.no_effect.end(), t.engine.aio.no_effect.begin(), t.engine.aio.no_effect.end());
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

  // The resolved config: what was given, with "auto" filled in and the derived values spelled out.
  c["train_batch_size"] = t.train_batch_size;
  c["train_micro_batch_size_per_gpu"] = t.micro_batch_size;
  c["gradient_accumulation_steps"] = t.engine.gradient_accumulation_steps;
  c["steps_per_print"] = t.steps_per_print;
  c["gradient_clipping"] = t.engine.gradient_clipping;
  c["model"] = {{"vocab_size", t.model.vocab_size}, {"seq_len", t.model.seq_len},
                {"n_layer", t.model.n_layer},       {"n_head", t.model.n_head},
                {"n_embd", t.model.n_embd},         {"activation_checkpointing", t.model.activation_checkpointing}};
  if (!t.model_preset.empty()) c["model"]["preset"] = t.model_preset;
  const char* formats[] = {"bin", "text", "synthetic"};
  c["data"] = {{"format", formats[static_cast<int>(t.data.format)]}};
  if (t.data.format == DataFormat::synthetic) {
    c["data"]["vocab_size"] = t.data.vocab_size;
    c["data"]["tokens"] = t.data.synthetic_tokens;
  } else {
    c["data"]["train"] = t.data.train;
    if (!t.data.val.empty()) c["data"]["val"] = t.data.val;
    else c["data"]["val_fraction"] = t.data.val_fraction;
  }
  c["run"] = {{"name", t.run.name},
              {"steps", t.run.steps},
              {"eval_interval", t.run.eval_interval},
              {"eval_batches", t.run.eval_batches},
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
              {"trace", t.run.trace}};
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
    ZEROTH_THROW(ConfigError, "{}:{}:{}: not valid JSON: {}", path, line, col, e.what());
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

}  // namespace zeroth
