#include "train/hf/model_config.h"

#include <filesystem>   // std::filesystem::is_directory
#include <fstream>      // std::ifstream
#include <set>          // std::set
#include <string_view>  // std::string_view

#include <fmt/format.h>  // fmt::format

#include "core/error.h"  // ZEROTH_THROW

namespace zeroth {
namespace {

using json = nlohmann::json;

// Keys that change nothing zeroth computes: token ids, the weights' dtype, inference caches, the
// initializer (zeroth's own init rules, or the weights from run.init_from), bookkeeping.
const std::set<std::string_view> kNoEffect = {"_name_or_path",
                                              "architectures",
                                              "model_type",
                                              "transformers_version",
                                              "torch_dtype",
                                              "dtype",
                                              "bos_token_id",
                                              "eos_token_id",
                                              "pad_token_id",
                                              "use_cache",
                                              "initializer_range",
                                              "max_window_layers",
                                              "_attn_implementation_autoset",
                                              "rope_type"};
// GPT-2's dropout and its sequence-summary head (for classification), which a language model
// trained here does not have: named once as unused.
const std::set<std::string_view> kGpt2Unused = {"resid_pdrop",
                                                "embd_pdrop",
                                                "attn_pdrop",
                                                "summary_type",
                                                "summary_use_proj",
                                                "summary_activation",
                                                "summary_proj_to_labels",
                                                "summary_first_dropout",
                                                "task_specific_params",
                                                "n_special",
                                                "predict_special_tokens"};

class Reader {
 public:
  Reader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  int integer(const char* key, int lo = 1) {
    used_.insert(key);
    if (!has(key)) ZEROTH_THROW(ConfigError, "{}: {} is missing; it is needed to build the model", source_, key);
    const json& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > (int64_t{1} << 30))
      ZEROTH_THROW(ConfigError, "{}: {} must be an integer of at least {}, got {}", source_, key, lo, v.dump());
    return v.get<int>();
  }
  int integer_or(const char* key, int def) { return has(key) ? integer(key, 1) : (used_.insert(key), def); }
  double number_or(const char* key, double def) {
    used_.insert(key);
    if (!has(key)) return def;
    if (!j_[key].is_number()) ZEROTH_THROW(ConfigError, "{}: {} must be a number, got {}", source_, key, j_[key].dump());
    return j_[key].get<double>();
  }
  bool flag_or(const char* key, bool def) {
    used_.insert(key);
    if (!has(key)) return def;
    if (!j_[key].is_boolean()) ZEROTH_THROW(ConfigError, "{}: {} must be true or false, got {}", source_, key, j_[key].dump());
    return j_[key].get<bool>();
  }
  // A key zeroth computes with one value only: absent, null or that value.
  void require(const char* key, const json& value, std::string_view why) {
    used_.insert(key);
    if (has(key) && j_[key] != value)
      ZEROTH_THROW(ConfigError, "{}: {} is {}, but zeroth {}; it cannot train this model as the file describes it", source_, key,
                   j_[key].dump(), why);
  }
  void use(const char* key) { used_.insert(key); }
  // Every key read, required or known; the rest named as errors, or (`unused`) listed.
  void finish(const std::set<std::string_view>& unused_ok, std::vector<std::string>& unused) const {
    for (const auto& [key, value] : j_.items()) {
      if (used_.contains(key) || kNoEffect.contains(key)) continue;
      if (unused_ok.contains(key)) {
        unused.push_back(fmt::format("{} {}", key, value.dump()));
        continue;
      }
      ZEROTH_THROW(ConfigError, "{}: key {} ({}) is not one zeroth can honour for this architecture; remove it if it does not matter",
                   source_, key, value.dump());
    }
  }

 private:
  const json& j_;
  std::string source_;
  std::set<std::string, std::less<>> used_;
};

void read_rope_scaling(Reader& r, const json& j, const std::string& source, GptConfig& c) {
  r.use("rope_scaling");
  if (j.contains("rope_scaling")) c.rope_scaling = rope_scaling_from_json(j["rope_scaling"], source + ": rope_scaling");
}

GptConfig read_llama(Reader& r, const json& j, const std::string& architecture, const std::string& source) {
  GptConfig c;
  c.architecture = Architecture::llama;
  c.vocab_size = r.integer("vocab_size");
  c.n_embd = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.n_layer = r.integer("num_hidden_layers");
  c.n_head = r.integer("num_attention_heads");
  c.n_kv_head = r.integer_or("num_key_value_heads", c.n_head);
  c.head_dim = r.integer_or("head_dim", 0);
  if (c.head_dim == 0 && c.n_embd % c.n_head != 0)
    ZEROTH_THROW(ConfigError, "{}: hidden_size {} is not a multiple of num_attention_heads {} and head_dim is not given", source,
                 c.n_embd, c.n_head);
  c.norm_eps = r.number_or("rms_norm_eps", 1e-6);
  c.rope_theta = r.number_or("rope_theta", 10000.0);
  c.tie_word_embeddings = r.flag_or("tie_word_embeddings", false);
  read_rope_scaling(r, j, source, c);
  // Llama's attention_bias puts a bias on q, k, v and o; Qwen2 has q/k/v biases always and none on o.
  const bool bias = r.flag_or("attention_bias", false);
  c.qkv_bias = bias || architecture == "Qwen2ForCausalLM";
  c.o_bias = bias;
  c.qk_norm = architecture == "Qwen3ForCausalLM" || architecture == "Qwen3MoeForCausalLM";
  r.require("hidden_act", "silu", "computes SwiGLU with SiLU");
  r.require("mlp_bias", false, "has no MLP biases");
  r.require("attention_dropout", 0.0, "trains without dropout");
  r.require("pretraining_tp", 1, "computes the projections whole");
  r.require("use_sliding_window", false, "attends to the whole sequence");
  r.require("use_mrope", false, "turns positions along one axis");
  r.use("sliding_window");  // checked against the run's sequence length by the caller
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    r.use("layer_types");
    for (const auto& t : j["layer_types"]) {
      if (t != "full_attention")
        ZEROTH_THROW(ConfigError, "{}: layer_types holds {}; zeroth computes full attention in every layer", source, t.dump());
    }
  }
  return c;
}

// Mixtral: every layer's MLP is num_local_experts SwiGLU experts of intermediate_size, top
// num_experts_per_tok of them, renormalised, dropless. Hugging Face adds its load-balancing loss only
// with output_router_logits (its formula counts every chosen expert; zeroth's is GShard's, which
// counts the first choice: the coefficient carries over, the value differs by about top_k).
// Hugging Face's mixtures route dropless and add the loss only with output_router_logits.
void read_router(Reader& r, GptConfig& c) {
  c.moe.drop_tokens = false;
  c.moe.min_capacity = 0;
  const bool aux = r.flag_or("output_router_logits", false);
  const double coef = r.number_or("router_aux_loss_coef", 0.001);
  c.moe.aux_loss_coef = aux ? coef : 0.0;
  c.moe.z_loss_coef = 0;
}

void read_mixtral(Reader& r, GptConfig& c) {
  c.moe.num_experts = r.integer("num_local_experts");
  c.moe.top_k = r.integer("num_experts_per_tok");
  c.moe.every = 1;
  c.moe.normalize_top_k = true;
  read_router(r, c);
  r.require("router_jitter_noise", 0.0, "routes without jitter noise");
}

// Qwen3-MoE: Qwen3's attention; every decoder_sparse_step-th layer's MLP is num_experts SwiGLU
// experts of moe_intermediate_size (the others intermediate_size wide), top num_experts_per_tok,
// renormalised with norm_topk_prob, dropless; the auxiliary loss as Mixtral's.
void read_qwen3_moe(Reader& r, const json& j, const std::string& source, GptConfig& c) {
  c.moe.num_experts = r.integer("num_experts");
  c.moe.top_k = r.integer("num_experts_per_tok");
  c.moe.intermediate_size = r.integer("moe_intermediate_size");
  c.moe.every = r.integer_or("decoder_sparse_step", 1);
  c.moe.normalize_top_k = r.flag_or("norm_topk_prob", false);
  read_router(r, c);
  r.use("mlp_only_layers");
  if (j.contains("mlp_only_layers") && !(j["mlp_only_layers"].is_array() && j["mlp_only_layers"].empty()))
    ZEROTH_THROW(ConfigError, "{}: mlp_only_layers is {}; zeroth places expert layers by decoder_sparse_step alone (give [])", source,
                 j["mlp_only_layers"].dump());
}

GptConfig read_gpt2(Reader& r) {
  GptConfig c;
  c.vocab_size = r.integer("vocab_size");
  c.n_embd = r.integer("n_embd");
  c.n_layer = r.integer("n_layer");
  c.n_head = r.integer("n_head");
  r.use("n_positions");
  r.use("n_ctx");
  r.require("activation_function", "gelu_new", "computes GPT-2's tanh GELU");
  r.require("layer_norm_epsilon", 1e-5, "normalizes with epsilon 1e-5");
  r.require("n_inner", nullptr, "uses an MLP of 4 n_embd");
  r.require("scale_attn_weights", true, "scales attention scores by 1/sqrt(head size)");
  r.require("scale_attn_by_inverse_layer_idx", false, "scales every layer's scores alike");
  r.require("reorder_and_upcast_attn", false, "computes attention in f32");
  r.require("tie_word_embeddings", true, "ties GPT-2's head to its embedding");
  return c;
}

}  // namespace

RopeScaling rope_scaling_from_json(const json& s, const std::string& where) {
  RopeScaling out;
  if (s.is_null()) return out;
  if (!s.is_object()) ZEROTH_THROW(ConfigError, "{} must be an object or null, got {}", where, s.dump());
  try {
    const std::string type = s.value("rope_type", s.value("type", std::string("default")));
    out.factor = s.value("factor", 1.0);
    if (type == "linear") {
      out.type = RopeScaling::Type::linear;
    } else if (type == "llama3") {
      out.type = RopeScaling::Type::llama3;
      out.low_freq_factor = s.value("low_freq_factor", 1.0);
      out.high_freq_factor = s.value("high_freq_factor", 4.0);
      out.original_max_position_embeddings = s.value("original_max_position_embeddings", 8192);
    } else if (type != "default") {
      ZEROTH_THROW(ConfigError, "{}: type \"{}\" is not one zeroth computes (linear, llama3)", where, type);
    }
  } catch (const json::exception& e) {
    ZEROTH_THROW(ConfigError, "{}: {}", where, e.what());
  }
  if (!(out.factor > 0)) ZEROTH_THROW(ConfigError, "{}: factor must be positive, got {}", where, out.factor);
  return out;
}

json rope_scaling_to_json(const RopeScaling& r) {
  if (r.type == RopeScaling::Type::linear) return {{"rope_type", "linear"}, {"factor", r.factor}};
  if (r.type == RopeScaling::Type::llama3) {
    return {{"rope_type", "llama3"},
            {"factor", r.factor},
            {"low_freq_factor", r.low_freq_factor},
            {"high_freq_factor", r.high_freq_factor},
            {"original_max_position_embeddings", r.original_max_position_embeddings}};
  }
  return nullptr;
}

HfModelConfig hf_config_from_json(const json& j, const std::string& source) {
  if (!j.is_object()) ZEROTH_THROW(ConfigError, "{} is not a JSON object", source);
  if (!j.contains("architectures") || !j["architectures"].is_array() || j["architectures"].size() != 1 ||
      !j["architectures"][0].is_string()) {
    ZEROTH_THROW(ConfigError, "{}: architectures must name one model class, such as [\"LlamaForCausalLM\"]", source);
  }
  HfModelConfig out;
  out.architecture = j["architectures"][0].get<std::string>();
  Reader r(j, source);
  const std::string& a = out.architecture;
  if (a == "LlamaForCausalLM" || a == "MistralForCausalLM" || a == "Qwen2ForCausalLM" || a == "Qwen3ForCausalLM" ||
      a == "MixtralForCausalLM" || a == "Qwen3MoeForCausalLM") {
    out.model = read_llama(r, j, a, source);
    if (a == "MixtralForCausalLM") read_mixtral(r, out.model);
    if (a == "Qwen3MoeForCausalLM") read_qwen3_moe(r, j, source, out.model);
    out.max_positions = r.integer_or("max_position_embeddings", 0);
    r.finish({}, out.unused);
  } else if (a == "GPT2LMHeadModel") {
    out.model = read_gpt2(r);
    out.max_positions = r.integer_or("n_positions", r.integer_or("n_ctx", 0));
    r.finish(kGpt2Unused, out.unused);
  } else {
    ZEROTH_THROW(ConfigError,
                 "{}: architecture {} is not one zeroth builds; it trains LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, "
                 "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM and GPT2LMHeadModel",
                 source, a);
  }
  // Mistral and Mixtral attend within their window; Llama's and Qwen's configs may carry the key unused.
  if ((a == "MistralForCausalLM" || a == "MixtralForCausalLM") && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    if (!j["sliding_window"].is_number_integer())
      ZEROTH_THROW(ConfigError, "{}: sliding_window must be an integer or null, got {}", source, j["sliding_window"].dump());
    out.sliding_window = j["sliding_window"].get<int>();
  }
  return out;
}

nlohmann::ordered_json hf_config_to_json(const GptConfig& m, DType dtype) {
  const std::string torch_dtype = dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
  if (m.hf_architecture().empty()) {
    ZEROTH_THROW(InvalidArgument,
                 "no Hugging Face class holds this model ({}): of the mixtures of experts, Hugging Face has Mixtral's shape "
                 "(SwiGLU experts in every layer, top-k renormalised, dropless) and Qwen3-MoE's (the same with per-head q/k norms, "
                 "in every n-th layer, renormalised or not); export it with --format safetensors",
                 m.describe());
  }
  nlohmann::ordered_json j;
  j["architectures"] = {m.hf_architecture()};
  if (!m.llama()) {
    // GPT-2's position table has model.seq_len rows.
    j["model_type"] = "gpt2";
    j["vocab_size"] = m.vocab_size, j["n_positions"] = m.seq_len, j["n_ctx"] = m.seq_len;
    j["n_embd"] = m.n_embd, j["n_layer"] = m.n_layer, j["n_head"] = m.n_head;
    j["activation_function"] = "gelu_new", j["layer_norm_epsilon"] = 1e-5;
    j["tie_word_embeddings"] = true;
    j["torch_dtype"] = torch_dtype;
    return j;
  }
  const std::string a = m.hf_architecture();
  if (a == "Qwen3ForCausalLM" && m.qkv_bias != m.o_bias)
    ZEROTH_THROW(InvalidArgument, "no Hugging Face class has per-head q/k norms with biases on q, k and v but not o; these weights "
                                  "have no config.json");
  j["model_type"] = a == "Qwen3ForCausalLM"      ? "qwen3"
                    : a == "Qwen2ForCausalLM"    ? "qwen2"
                    : a == "MixtralForCausalLM"  ? "mixtral"
                    : a == "Qwen3MoeForCausalLM" ? "qwen3_moe"
                                                 : "llama";
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.n_embd;
  j["intermediate_size"] = a == "MixtralForCausalLM" ? m.expert_ffn() : m.ffn();
  if (a == "MixtralForCausalLM") {
    j["num_local_experts"] = m.moe.num_experts;
    j["num_experts_per_tok"] = m.moe.top_k;
    j["output_router_logits"] = m.moe.aux_loss_coef > 0;
    j["router_aux_loss_coef"] = m.moe.aux_loss_coef > 0 ? m.moe.aux_loss_coef : 0.001;
    j["router_jitter_noise"] = 0.0;
  }
  if (a == "Qwen3MoeForCausalLM") {
    j["num_experts"] = m.moe.num_experts;
    j["num_experts_per_tok"] = m.moe.top_k;
    j["moe_intermediate_size"] = m.expert_ffn();
    j["decoder_sparse_step"] = m.moe.every;
    j["mlp_only_layers"] = nlohmann::ordered_json::array();
    j["norm_topk_prob"] = m.moe.normalize_top_k;
    j["output_router_logits"] = m.moe.aux_loss_coef > 0;
    j["router_aux_loss_coef"] = m.moe.aux_loss_coef > 0 ? m.moe.aux_loss_coef : 0.001;
  }
  j["num_hidden_layers"] = m.n_layer;
  j["num_attention_heads"] = m.n_head;
  j["num_key_value_heads"] = m.kv_heads();
  j["head_dim"] = m.head_size();
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = m.max_positions > 0 ? m.max_positions : m.seq_len;
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_theta"] = m.rope_theta;
  j["rope_scaling"] = rope_scaling_to_json(m.rope_scaling);
  // Qwen2 has q/k/v biases and no key for them; Llama's and Qwen3's attention_bias covers q, k, v and o.
  if (a != "Qwen2ForCausalLM" && a != "MixtralForCausalLM") j["attention_bias"] = m.o_bias;
  if (a != "MixtralForCausalLM") j["mlp_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["tie_word_embeddings"] = m.tie_word_embeddings;
  j["torch_dtype"] = torch_dtype;
  return j;
}

HfModelConfig read_hf_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string file = fs::is_directory(path, ec) ? (fs::path(path) / "config.json").string() : path;
  std::ifstream in(file);
  if (!in) ZEROTH_THROW(ConfigError, "model.hf_config: cannot open {}; give a Hugging Face config.json or its folder", file);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    ZEROTH_THROW(ConfigError, "model.hf_config: {} is not valid JSON: {}", file, e.what());
  }
  return hf_config_from_json(j, file);
}

}  // namespace zeroth
