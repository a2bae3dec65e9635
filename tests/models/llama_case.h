// A Llama-family model as tests/reference/llama_reference.py describes it in its metadata (its
// CASES entry as JSON), in zeroth's terms.
#pragma once

#include <nlohmann/json.hpp>  // nlohmann::json

#include "models/decoder/gpt.h"  // GptConfig

namespace zeroth::testing {

inline GptConfig llama_case_config(const nlohmann::json& j) {
  GptConfig c;
  c.architecture = Architecture::llama;
  c.vocab_size = j["vocab_size"], c.seq_len = j["seq_len"], c.n_layer = j["n_layer"], c.n_head = j["n_head"], c.n_embd = j["n_embd"];
  c.n_kv_head = j["n_kv_head"], c.head_dim = j["head_dim"], c.intermediate_size = j["intermediate_size"];
  c.norm_eps = j["rms_norm_eps"], c.rope_theta = j["rope_theta"];
  const bool attention_bias = j.value("attention_bias", false);
  c.qkv_bias = j["qkv_bias"].get<bool>() || attention_bias, c.o_bias = attention_bias;
  c.qk_norm = j["qk_norm"], c.tie_word_embeddings = j["tie_word_embeddings"];
  if (const auto& s = j["rope_scaling"]; !s.is_null()) {
    c.rope_scaling.factor = s["factor"];
    if (s["rope_type"] == "linear") {
      c.rope_scaling.type = RopeScaling::Type::linear;
    } else {
      c.rope_scaling.type = RopeScaling::Type::llama3;
      c.rope_scaling.low_freq_factor = s["low_freq_factor"], c.rope_scaling.high_freq_factor = s["high_freq_factor"];
      c.rope_scaling.original_max_position_embeddings = s["original_max_position_embeddings"];
    }
  }
  if (j.contains("moe")) {
    const auto& m = j["moe"];
    c.moe.num_experts = m["num_experts"], c.moe.top_k = m["top_k"];
    c.moe.capacity_factor = m["capacity_factor"], c.moe.eval_capacity_factor = m["eval_capacity_factor"];
    c.moe.min_capacity = m["min_capacity"], c.moe.drop_tokens = m["drop_tokens"], c.moe.normalize_top_k = m["normalize_top_k"];
    c.moe.aux_loss_coef = m["aux_loss_coef"], c.moe.z_loss_coef = m["z_loss_coef"], c.moe.every = m["every"];
    c.moe.intermediate_size = m["intermediate_size"];
  }
  return c;
}

}  // namespace zeroth::testing
