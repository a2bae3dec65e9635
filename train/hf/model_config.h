// A Hugging Face model's config.json as zeroth's model: LlamaForCausalLM, MistralForCausalLM
// (without a sliding window shorter than the run's sequences), Qwen2ForCausalLM,
// Qwen3ForCausalLM and GPT2LMHeadModel. Every key of the file is either read, known to change
// nothing zeroth computes (ids, dtype, cache), required to hold the value zeroth computes with
// (silu, no MLP bias, no attention dropout), or an error naming it.
#pragma once

#include <string>  // std::string
#include <vector>  // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/dtype.h"          // DType
#include "models/decoder/gpt.h"  // GptConfig

namespace zeroth {

struct HfModelConfig {
  GptConfig model;
  int max_positions = 0;            // max_position_embeddings (n_positions): model.seq_len may not exceed it
  std::string architecture;         // as the file names it
  std::vector<std::string> unused;  // keys with no effect here (GPT-2's dropout: zeroth trains without it)
  int sliding_window = 0;           // Mistral's attention window (0: none); the run's sequences must fit in it
};

// Hugging Face's rope_scaling object (rope_type or type: linear, llama3; null or default: none).
// ConfigError naming `where`.
RopeScaling rope_scaling_from_json(const nlohmann::json& s, const std::string& where);
// The same object written back (null for none).
nlohmann::json rope_scaling_to_json(const RopeScaling& r);

// `path`: a config.json, or the folder that holds one. ConfigError naming the file and the key.
HfModelConfig read_hf_config(const std::string& path);
HfModelConfig hf_config_from_json(const nlohmann::json& j, const std::string& source);
// The config.json Hugging Face builds `model` from (its class from GptConfig::hf_architecture;
// max_position_embeddings from model.max_positions, else model.seq_len), weights stored as
// `dtype`: read back by hf_config_from_json into the same model.
nlohmann::ordered_json hf_config_to_json(const GptConfig& model, DType dtype);

}  // namespace zeroth
