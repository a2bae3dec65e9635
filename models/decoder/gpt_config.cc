// The GPT's configuration: the published presets, parameter counts (total and active per token),
// the checks that name the offending key, descriptions, and the rotary table.
#include <algorithm>  // std::max
#include <cmath>      // std::pow, std::cos, std::sin

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"   // ZEROTH_THROW
#include "core/memory.h"  // logits_chunk_rows
#include "models/decoder/gpt.h"

namespace zeroth {

// ---- configuration --------------------------------------------------------------------------

namespace {

// The Llama family's published shapes (their Hugging Face config.json), trained at 2048 positions.
struct LlamaPreset {
  std::string_view name;
  int vocab, C, F, L, NH, KVH;
  double theta, eps;
  bool tied, qkv_bias;
  RopeScaling scaling = {};
};
constexpr RopeScaling kLlama32{RopeScaling::Type::llama3, 32.0, 1.0, 4.0, 8192};
const LlamaPreset kLlamaPresets[] = {
    {"smollm-135m", 49152, 576, 1536, 30, 9, 3, 10000.0, 1e-5, true, false},
    {"smollm-360m", 49152, 960, 2560, 32, 15, 5, 10000.0, 1e-5, true, false},
    {"qwen2.5-0.5b", 151936, 896, 4864, 24, 14, 2, 1000000.0, 1e-6, true, true},
    {"llama-3.2-1b", 128256, 2048, 8192, 16, 32, 8, 500000.0, 1e-5, true, false, kLlama32},
    {"tinyllama-1.1b", 32000, 2048, 5632, 22, 32, 4, 10000.0, 1e-5, false, false},
    {"llama-2-7b", 32000, 4096, 11008, 32, 32, 32, 10000.0, 1e-5, false, false},
    {"llama-3-8b", 128256, 4096, 14336, 32, 32, 8, 500000.0, 1e-5, false, false},
    {"llama-3-70b", 128256, 8192, 28672, 80, 64, 8, 500000.0, 1e-5, false, false},
};

}  // namespace

GptConfig GptConfig::preset(std::string_view name) {
  GptConfig c;
  for (const LlamaPreset& p : kLlamaPresets) {
    if (p.name != name) continue;
    c.architecture = Architecture::llama;
    c.vocab_size = p.vocab, c.seq_len = 2048, c.n_embd = p.C, c.intermediate_size = p.F, c.n_layer = p.L, c.n_head = p.NH;
    c.n_kv_head = p.KVH, c.rope_theta = p.theta, c.norm_eps = p.eps, c.tie_word_embeddings = p.tied, c.qkv_bias = p.qkv_bias;
    c.rope_scaling = p.scaling;
    return c;
  }
  if (name == "gpt2-124m" || name == "gpt2") return c;
  if (name == "gpt2-350m") c.n_layer = 24, c.n_head = 16, c.n_embd = 1024;
  else if (name == "gpt2-774m") c.n_layer = 36, c.n_head = 20, c.n_embd = 1280;
  else if (name == "gpt2-1558m") c.n_layer = 48, c.n_head = 25, c.n_embd = 1600;
  else ZEROTH_THROW(ConfigError, "model.preset \"{}\" is not a known preset; use one of {}", name, fmt::join(preset_names(), ", "));
  return c;
}

std::vector<std::string> GptConfig::preset_names() {
  std::vector<std::string> out = {"gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1558m"};
  for (const LlamaPreset& p : kLlamaPresets) out.emplace_back(p.name);
  return out;
}

size_t GptConfig::num_parameters() const {
  size_t n = 0;
  for (const auto& b : Gpt::block_specs(*this)) {
    for (const auto& p : b.params) n += p.numel();
  }
  return n;
}

size_t GptConfig::active_parameters() const {
  size_t n = num_parameters();
  for (int l = 0; l < n_layer; ++l) {
    if (!moe_layer(l)) continue;
    const size_t expert = static_cast<size_t>(expert_ffn()) * n_embd * (llama() ? 3 : 2) + (llama() ? 0 : expert_ffn() + n_embd);
    n -= expert * static_cast<size_t>(moe.num_experts - moe.top_k);
  }
  return n;
}

double GptConfig::flops_per_token(int context) const {
  double n = static_cast<double>(active_parameters());
  if (!llama()) n -= static_cast<double>(seq_len) * n_embd;                 // wpe: looked up, not multiplied
  if (!tie_word_embeddings) n -= static_cast<double>(vocab_size) * n_embd;  // the input embedding, beside the head
  // A frozen weight's product has no weight gradient to make: 4 FLOPs a parameter, not 6. LoRA's
  // adapters are multiplied, and trained, beside the frozen base.
  double frozen = 0, adapters = 0;
  if (lora.enabled() || !frozen_blocks.empty()) {
    for (const auto& spec : Gpt::block_specs(*this)) {
      double numel = 0;
      for (const auto& p : spec.params)
        if (p.name != "wpe" && !(spec.name == "embed" && !tie_word_embeddings)) numel += static_cast<double>(p.numel());
      if (spec.name.ends_with(".experts")) numel *= static_cast<double>(moe.top_k) / moe.num_experts;
      if (spec.name.ends_with(".lora")) adapters += numel;
      else if (spec.frozen) frozen += numel;
    }
  }
  return 6 * (n + adapters) - 2 * frozen + 12.0 * n_layer * n_head * head_size() * (context > 0 ? context : seq_len);
}

void GptConfig::validate() const {
  auto positive = [](const char* key, int v) {
    if (v <= 0) ZEROTH_THROW(ConfigError, "model.{} must be a positive integer, got {}", key, v);
  };
  positive("vocab_size", vocab_size);
  positive("seq_len", seq_len);
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_embd", n_embd);
  if (!(llama() && head_dim > 0) && n_embd % n_head != 0) {
    ZEROTH_THROW(ConfigError, "model.n_embd ({}) must be a multiple of model.n_head ({}): each head gets n_embd / n_head channels",
                 n_embd, n_head);
  }
  if (llama()) {
    if (n_kv_head < 0 || head_dim < 0 || intermediate_size < 0)
      ZEROTH_THROW(ConfigError, "model.n_kv_head, model.head_dim and model.intermediate_size must not be negative (0: the default)");
    if (n_head % kv_heads() != 0) {
      ZEROTH_THROW(ConfigError,
                   "model.n_head ({}) must be a multiple of model.n_kv_head ({}): each key/value head serves a group of query heads",
                   n_head, kv_heads());
    }
    if (head_size() % 2 != 0)
      ZEROTH_THROW(ConfigError, "model.head_dim ({}) must be even: rotary embedding turns pairs of channels", head_size());
    if (!(norm_eps > 0)) ZEROTH_THROW(ConfigError, "model.rms_norm_eps must be positive, got {}", norm_eps);
    if (!(rope_theta > 0)) ZEROTH_THROW(ConfigError, "model.rope_theta must be positive, got {}", rope_theta);
    if (max_positions != 0 && max_positions < seq_len)
      ZEROTH_THROW(ConfigError, "model.max_position_embeddings ({}) must be 0 or at least model.seq_len ({})", max_positions, seq_len);
    if (rope_scaling.type != RopeScaling::Type::none && !(rope_scaling.factor > 0))
      ZEROTH_THROW(ConfigError, "model.rope_scaling.factor must be positive, got {}", rope_scaling.factor);
  } else if (n_kv_head != 0 || head_dim != 0 || intermediate_size != 0 || qkv_bias || o_bias || qk_norm || !tie_word_embeddings ||
             max_positions != 0 || rope_scaling.type != RopeScaling::Type::none) {
    ZEROTH_THROW(ConfigError,
                 "model.n_kv_head, head_dim, intermediate_size, attention biases, qk norms, rope_scaling and an untied head belong to "
                 "the Llama family; GPT-2 has none of them (set model.architecture to llama, or drop them)");
  }
  if (moe.enabled()) {
    if (moe.top_k < 1 || moe.top_k > moe.num_experts)
      ZEROTH_THROW(ConfigError, "model.moe.top_k ({}) must be within 1 and model.moe.num_experts ({})", moe.top_k, moe.num_experts);
    if (!(moe.capacity_factor > 0) || !(moe.eval_capacity_factor > 0))
      ZEROTH_THROW(ConfigError, "model.moe.capacity_factor and eval_capacity_factor must be positive, got {} and {}",
                   moe.capacity_factor, moe.eval_capacity_factor);
    if (moe.min_capacity < 0) ZEROTH_THROW(ConfigError, "model.moe.min_capacity must not be negative, got {}", moe.min_capacity);
    if (!(moe.aux_loss_coef >= 0) || !(moe.z_loss_coef >= 0))
      ZEROTH_THROW(ConfigError, "model.moe.aux_loss_coef and z_loss_coef must not be negative, got {} and {}", moe.aux_loss_coef,
                   moe.z_loss_coef);
    if (moe.every < 1 || moe.every > n_layer)
      ZEROTH_THROW(ConfigError,
                   "model.moe.every ({}) must be within 1 and model.n_layer ({}): layer l is an expert layer when (l + 1) "
                   "is a multiple of it",
                   moe.every, n_layer);
    if (moe.intermediate_size < 0) ZEROTH_THROW(ConfigError, "model.moe.intermediate_size must not be negative (0: the MLP's width)");
  } else if (moe.num_experts < 0) {
    ZEROTH_THROW(ConfigError, "model.moe.num_experts must not be negative, got {}", moe.num_experts);
  }
  if (loss_chunk_rows < 0) {
    ZEROTH_THROW(ConfigError,
                 "model.chunked_loss: {} tokens per chunk; give a positive count, true (sized to the vocabulary) or false",
                 loss_chunk_rows);
  }
  if (mlp_tile_rows < 0) {
    ZEROTH_THROW(ConfigError, "model.tiled_mlp: {} rows per tile; give a positive count, true (tiles of n_embd rows) or false",
                 mlp_tile_rows);
  }
  if (cpu_checkpointing && !activation_checkpointing) {
    ZEROTH_THROW(
        ConfigError,
        "activation_checkpointing.cpu_checkpointing moves the activation checkpoints to host memory, but checkpointing is off "
        "(model.activation_checkpointing false): turn it on, or drop cpu_checkpointing");
  }
}

int GptConfig::auto_loss_chunk_rows(int tensor_parallel) const {
  const size_t slice = (static_cast<size_t>(vocab_size) + tensor_parallel - 1) / std::max(1, tensor_parallel);
  return static_cast<int>(logits_chunk_rows(slice));
}

std::string GptConfig::describe() const {
  if (!llama()) {
    const std::string experts = moe.enabled()
                                    ? fmt::format(", {} experts of {} (top {}) in {} layers", moe.num_experts, expert_ffn(), moe.top_k,
                                                  moe.every == 1 ? std::string("all") : fmt::format("1 of every {}", moe.every))
                                    : "";
    return fmt::format("GPT-2 {} layers, {} heads, {} wide{}", n_layer, n_head, n_embd, experts);
  }
  std::string extras;
  if (moe.enabled())
    extras += fmt::format(", {} experts of {} (top {}) in {} layers", moe.num_experts, expert_ffn(), moe.top_k,
                          moe.every == 1 ? std::string("all") : fmt::format("1 of every {}", moe.every));
  if (qkv_bias) extras += o_bias ? ", attention biases" : ", q/k/v biases";
  if (qk_norm) extras += ", q/k norms";
  if (rope_scaling.type != RopeScaling::Type::none)
    extras += fmt::format(", {} rope scaling x{}", rope_scaling.type == RopeScaling::Type::llama3 ? "llama3" : "linear",
                          rope_scaling.factor);
  return fmt::format("{} {} layers, {} heads over {} key/value heads of {}, {} wide, MLP {}, rope theta {}{}, {} head",
                     hf_architecture().empty() ? "Llama-family" : hf_architecture(), n_layer, n_head, kv_heads(), head_size(), n_embd,
                     ffn(), rope_theta, extras, tie_word_embeddings ? "tied" : "untied");
}

std::string GptConfig::hf_architecture() const {
  if (!llama()) return moe.enabled() ? "" : "GPT2LMHeadModel";
  if (moe.enabled()) {
    // Mixtral's layers: every one sparse, renormalised, dropless, no attention biases or q/k norms.
    // Qwen3-MoE's: per-head q/k norms, every n-th layer sparse, renormalised or not, dropless.
    const bool mixtral = moe.every == 1 && moe.normalize_top_k && !moe.drop_tokens && !qkv_bias && !qk_norm;
    const bool qwen3 = qk_norm && !moe.drop_tokens && !qkv_bias && !o_bias;
    return mixtral ? "MixtralForCausalLM" : qwen3 ? "Qwen3MoeForCausalLM" : "";
  }
  if (qk_norm) return "Qwen3ForCausalLM";
  if (qkv_bias && !o_bias) return "Qwen2ForCausalLM";
  return "LlamaForCausalLM";
}

std::vector<float> GptConfig::rope_table() const {
  const int hs = head_size(), half = hs / 2;
  // Hugging Face's default rotary frequencies, in f32 as it computes them: theta^(-2i / hs).
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(hs);
    inv[i] = 1.0f / static_cast<float>(std::pow(rope_theta, static_cast<double>(e)));
  }
  const RopeScaling& r = rope_scaling;
  if (r.type == RopeScaling::Type::linear) {
    for (float& f : inv) f = static_cast<float>(f / r.factor);
  } else if (r.type == RopeScaling::Type::llama3) {
    // Llama 3.1's: long wavelengths slowed by the factor, short ones kept, those between blended.
    const double old_len = r.original_max_position_embeddings, low = old_len / r.low_freq_factor, high = old_len / r.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen > low) {
        f = static_cast<float>(f / r.factor);
      } else if (wavelen >= high) {
        const double smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = static_cast<float>((1 - smooth) * f / r.factor + smooth * f);
      }
    }
  }
  std::vector<float> table(static_cast<size_t>(seq_len) * hs);
  for (int t = 0; t < seq_len; ++t) {
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(t) * inv[i];
      table[static_cast<size_t>(t) * hs + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      table[static_cast<size_t>(t) * hs + half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return table;
}

}  // namespace zeroth
