// The data, run and monitor sections of a training config.


#include "core/config_section.h"  // ConfigSection, is_auto
#include "core/error.h"           // ZEROTH_THROW
#include "core/memory.h"          // parse_bytes
#include "train/config/sections.h"
#include "train/text/tokenizer.h"  // Tokenizer

namespace zeroth {

using json = nlohmann::json;

namespace {

// data.fields: the keys each shape's records use.
corpus::Fields read_fields(const ConfigSection& s) {
  static constexpr std::string_view kKeys[] = {"messages", "prompt", "completion", "text"};
  corpus::Fields f;
  if (!s.has("fields")) return f;
  if (!s.raw("fields").is_object())
    ZEROTH_THROW(ConfigError, "{} must be an object such as {{\"messages\": \"conversation\"}}, got {}", s.at("fields"),
                 s.raw("fields").dump());
  ConfigSection fs(s.raw("fields"), s.at("fields"), kKeys);
  f.messages = fs.string("messages", f.messages);
  f.prompt = fs.string("prompt", f.prompt);
  f.completion = fs.string("completion", f.completion);
  f.text = fs.string("text", f.text);
  return f;
}

}  // namespace

void read_data(TrainConfig& t, const json& j) {
  static constexpr std::string_view kKeys[] = {"format",    "train",  "val",     "val_fraction",  "vocab_size", "tokens",
                                               "tokenizer", "fields", "loss_on", "chat_template", "truncate",   "packing"};
  static constexpr std::string_view kFormats[] = {"bin", "text", "synthetic", "jsonl"};
  static constexpr std::string_view kLossOn[] = {"assistant", "completion", "all"};
  const json section = j.value("data", json::object());
  ConfigSection s(section, "data", kKeys);
  DataConfig d;
  d.tokenizer = s.string("tokenizer", "");
  const std::string f = s.string("format", s.has("tokenizer") ? "text" : s.has("train") ? "bin" : "synthetic", kFormats);
  d.format = f == "bin" ? DataFormat::bin : f == "text" ? DataFormat::text : f == "jsonl" ? DataFormat::jsonl : DataFormat::synthetic;
  d.train = s.string("train", "");
  d.val = s.string("val", "");
  d.val_fraction = s.number("val_fraction", 0.1, 0.0, 0.5);
  if (d.format != DataFormat::synthetic && d.train.empty()) {
    ZEROTH_THROW(ConfigError, "data.train is required for data.format \"{}\" (a path to the training {})", f,
                 d.format == DataFormat::bin     ? "token file in llm.c's .bin format"
                 : d.format == DataFormat::jsonl ? "records: a .jsonl or .jsonl.gz file, or a folder of them"
                                                 : "text file");
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
  if (d.format == DataFormat::jsonl) {
    d.fields = read_fields(s);
    const std::string l = s.string("loss_on", "", kLossOn);
    d.loss_on = l == "assistant"    ? corpus::LossOn::assistant
                : l == "completion" ? corpus::LossOn::completion
                : l == "all"        ? corpus::LossOn::all
                                    : corpus::LossOn::automatic;
    d.chat_template = s.string("chat_template", "");
    d.truncate = s.flag("truncate", true);
    d.packing = s.flag("packing", false);
  } else {
    for (const char* key : {"fields", "loss_on", "chat_template", "truncate", "packing"}) {
      if (s.has(key))
        ZEROTH_THROW(ConfigError, "{} belongs to data.format \"jsonl\" (records of conversations, prompts and completions, texts)",
                     s.at(key));
    }
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

}  // namespace zeroth
