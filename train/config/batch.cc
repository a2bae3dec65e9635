// DeepSpeed's batch and precision keys of a training config: "auto" values as Hugging Face's
// integration fills them in, the batch triple, bf16/fp16 and the communication dtype.
#include <algorithm>   // std::max
#include <cctype>      // std::tolower
#include <cmath>       // std::ceil
#include <functional>  // std::function
#include <string>      // std::string

#include "core/config_section.h"           // ConfigSection, is_auto
#include "core/error.h"                    // ZEROTH_THROW
#include "engine/config/deepspeed_keys.h"  // without_deepspeed_extras
#include "train/config/sections.h"

namespace zeroth {

using json = nlohmann::json;

namespace {

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
}

}  // namespace

// The "auto" values left in the sections whose parsers take them as DeepSpeed's defaults
// (AutoValues::mean_default), out of the resolved config once those parsers have checked every key.
void drop_default_autos(json& c) {
  std::function<void(json&)> drop = [&](json& obj) {
    if (!obj.is_object()) return;
    for (auto it = obj.begin(); it != obj.end();) {
      if (is_auto(*it)) {
        it = obj.erase(it);
      } else {
        drop(*it);
        ++it;
      }
    }
  };
  for (const char* k : {"zero_optimization", "fp16", "bf16", "bfloat16"}) {
    if (c.contains(k)) drop(c[k]);
  }
}

namespace {

DType parse_comm_dtype(std::string s) {
  // DeepSpeed lower-cases the value; "bfp16" is its older spelling of bf16.
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (s == "fp32" || s == "float32") return DType::f32;
  if (s == "bf16" || s == "bfloat16" || s == "bfp16") return DType::bf16;
  if (s == "fp16" || s == "float16") return DType::f16;
  ZEROTH_THROW(ConfigError, "communication_data_type = \"{}\" is not one of: fp32, bf16, fp16", s);
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
  const int64_t dp = t.sample_parallel();
  ZEROTH_CHECK(dp >= 1, "{} ranks hold no data-parallel group (the parallel section should have refused them)", t.run.world_size);
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
    ConfigSection s(j["data_types"], "data_types", kKeys);
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

}  // namespace

void read_precision(TrainConfig& t, const json& j) {
  static constexpr std::string_view kBf16Keys[] = {"enabled"};
  const char* bf16_key = j.contains("bf16") ? "bf16" : "bfloat16";
  bool fp16 = false, bf16 = false;
  if (j.contains(bf16_key)) {
    // bfloat16 is DeepSpeed's old name of the same section.
    const json rest = without_deepspeed_extras(j[bf16_key], bf16_key, kBf16Keys, t.no_effect, UnknownKeys::ignore_unless_typo,
                                               AutoValues::mean_default);
    const ConfigSection s(rest, bf16_key, kBf16Keys);
    bf16 = s.flag("enabled", false);
  }
  if (j.contains("fp16")) {
    if (!j["fp16"].is_object()) ZEROTH_THROW(ConfigError, "fp16 must be an object like {{\"enabled\": true}}");
    const json f = without_deepspeed_extras(j["fp16"], "fp16", LossScalerConfig::kDeepSpeedKeys, t.no_effect, UnknownKeys::refuse,
                                            AutoValues::mean_default);
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

// DeepSpeed's "auto" values and the batch sizes, which need the data-parallel size; the default
// synthetic data sized to the batch.
void read_batch(TrainConfig& t, json& c) {
  t.schedule_steps_auto = c.contains("scheduler") && c["scheduler"].is_object() && c["scheduler"].contains("params") &&
                          c["scheduler"]["params"].is_object() && c["scheduler"]["params"].contains("total_num_steps") &&
                          is_auto(c["scheduler"]["params"]["total_num_steps"]);
  resolve_auto(c, t.sample_parallel(), t.run.steps, t.model.n_embd);
  check_deepspeed_extras(c);
  resolve_batch(t, c);
  if (DataConfig& d = t.data; d.format == DataFormat::synthetic && d.synthetic_tokens == 0) {
    // 8 steps of training windows after the held-out tail, data.val_fraction of the whole (a
    // validation measures what windows it has).
    const int64_t window = t.model.seq_len + 1;
    const double whole = static_cast<double>(8 * t.train_batch_size * window) / (1 - d.val_fraction);
    d.synthetic_tokens = std::max<int64_t>(int64_t{1} << 20, static_cast<int64_t>(std::ceil(whole)) + window);
  }
  if (const int tp = t.parallel.tensor; t.parallel.sequence_parallel && (t.micro_batch_size * t.model.seq_len) % tp != 0) {
    ZEROTH_THROW(ConfigError,
                 "parallel.sequence_parallel splits each micro-batch's {} x {} = {} tokens (train_micro_batch_size_per_gpu x "
                 "model.seq_len) over the {} tensor-parallel ranks; make the count a multiple of {}",
                 t.micro_batch_size, t.model.seq_len, t.micro_batch_size * t.model.seq_len, tp, tp);
  }
}

}  // namespace zeroth
