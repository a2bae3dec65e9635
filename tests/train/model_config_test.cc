// The model section for the Llama family: Hugging Face config.json files (the published shapes of
// Llama 3.2, Qwen2.5, Qwen3, Mistral, Mixtral and GPT-2) read into the model, every key they hold either
// read, known to change nothing, or an error naming it; the same switches as keys of `model`;
// and the presets' parameter counts against the published ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/decoder/gpt.h"
#include "train/hf/model_config.h"
#include "train/config/train_config.h"

namespace zeroth {
namespace {

using json = nlohmann::json;

std::string message(const std::exception& e) {
  std::string s = e.what();
  const auto at = s.rfind(" [");
  return at == std::string::npos ? s : s.substr(0, at);
}

// Llama 3.2 1B's config.json as published (Hugging Face, meta-llama/Llama-3.2-1B).
json llama32() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
                     "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0",
    "use_cache": true, "vocab_size": 128256})");
}

// Qwen2.5 0.5B's (Qwen/Qwen2.5-0.5B).
json qwen25() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
    "use_mrope": false, "use_sliding_window": false, "vocab_size": 151936})");
}

// PaLM's estimate for GPT-2 124M, by hand: N = 124,439,808 parameters less wpe's 1024 x 768 =
// 123,653,376; 6 N = 741,920,256; 12 L H Q T = 12 x 12 x 12 x 64 x 1024 = 113,246,208.
TEST(ModelFlops, Gpt2SmallIsPalmsEstimate) {
  const auto g = GptConfig::preset("gpt2-124m");
  EXPECT_EQ(g.num_parameters(), 124439808u);
  EXPECT_EQ(g.flops_per_token(), 741920256.0 + 113246208.0);
}

TEST(HfConfig, Llama32ReadsItsShapeAndRopeScaling) {
  const HfModelConfig hf = hf_config_from_json(llama32(), "config.json");
  const GptConfig& c = hf.model;
  EXPECT_TRUE(c.llama());
  EXPECT_EQ(c.n_embd, 2048);
  EXPECT_EQ(c.n_layer, 16);
  EXPECT_EQ(c.n_head, 32);
  EXPECT_EQ(c.kv_heads(), 8);
  EXPECT_EQ(c.head_size(), 64);
  EXPECT_EQ(c.ffn(), 8192);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::llama3);
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.qk_norm);
  EXPECT_EQ(hf.max_positions, 131072);
  EXPECT_EQ(c.hf_architecture(), "LlamaForCausalLM");
}

TEST(HfConfig, Qwen2HasQkvBiasesAndQwen3QkNorms) {
  const GptConfig q2 = hf_config_from_json(qwen25(), "config.json").model;
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.o_bias);
  EXPECT_EQ(q2.hf_architecture(), "Qwen2ForCausalLM");
  json j = qwen25();
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["head_dim"] = 128;
  j.erase("use_mrope");
  const GptConfig q3 = hf_config_from_json(j, "config.json").model;
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_FALSE(q3.qkv_bias);
  EXPECT_EQ(q3.head_size(), 128);
  EXPECT_EQ(q3.hf_architecture(), "Qwen3ForCausalLM");
}

TEST(HfConfig, WhatZerothCannotHonourIsAnErrorNamingIt) {
  struct Case {
    const char* key;
    json value;
    const char* error;
  };
  const Case cases[] = {
      {"hidden_act", "gelu",
       "config.json: hidden_act is \"gelu\", but zeroth computes SwiGLU with SiLU; it cannot train this model as the file describes "
       "it"},
      {"mlp_bias", true,
       "config.json: mlp_bias is true, but zeroth has no MLP biases; it cannot train this model as the file describes it"},
      {"quantization_config", json::object(),
       "config.json: key quantization_config ({}) is not one zeroth can honour for this architecture; remove it if it does not "
       "matter"},
      {"rope_scaling", json{{"rope_type", "yarn"}, {"factor", 4.0}},
       "config.json: rope_scaling: type \"yarn\" is not one zeroth computes (linear, llama3)"},
      {"architectures", json::array({"PhiForCausalLM"}),
       "config.json: architecture PhiForCausalLM is not one zeroth builds; it trains LlamaForCausalLM, MistralForCausalLM, "
       "MixtralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM and GPT2LMHeadModel"},
  };
  for (const Case& c : cases) {
    json j = llama32();
    j[c.key] = c.value;
    try {
      hf_config_from_json(j, "config.json");
      ADD_FAILURE() << c.key << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(message(e), c.error);
    }
  }
}

// What an export writes as config.json reads back as the same model, for every published shape
// (the Llama 3 presets' rope_scaling, Qwen2's q/k/v biases, Qwen3's norms, GPT-2) and for a model
// built from a Hugging Face file, whose max_position_embeddings it keeps.
TEST(HfConfig, AnExportsConfigReadsBackAsTheSameModel) {
  auto same = [](const GptConfig& a, const GptConfig& b, const std::string& what) {
    EXPECT_EQ(a.describe(), b.describe()) << what;
    EXPECT_EQ(a.hf_architecture(), b.hf_architecture()) << what;
    EXPECT_EQ(a.vocab_size, b.vocab_size) << what;
    EXPECT_EQ(a.kv_heads(), b.kv_heads()) << what;
    EXPECT_EQ(a.head_size(), b.head_size()) << what;
    EXPECT_EQ(a.ffn(), b.ffn()) << what;
    EXPECT_EQ(a.norm_eps, b.norm_eps) << what;
    EXPECT_EQ(a.rope_theta, b.rope_theta) << what;
    EXPECT_EQ(rope_scaling_to_json(a.rope_scaling), rope_scaling_to_json(b.rope_scaling)) << what;
    EXPECT_EQ(a.qkv_bias, b.qkv_bias) << what;
    EXPECT_EQ(a.o_bias, b.o_bias) << what;
    EXPECT_EQ(a.qk_norm, b.qk_norm) << what;
    EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings) << what;
    EXPECT_EQ(a.num_parameters(), b.num_parameters()) << what;
  };
  for (const auto& name : GptConfig::preset_names()) {
    const GptConfig m = GptConfig::preset(name);
    const json written = json::parse(hf_config_to_json(m, DType::bf16).dump());
    const HfModelConfig back = hf_config_from_json(written, name);
    same(m, back.model, name);
    EXPECT_EQ(back.max_positions, m.seq_len) << name;  // the presets keep no longer context
  }
  GptConfig llama = hf_config_from_json(llama32(), "config.json").model;
  llama.max_positions = 131072;
  const HfModelConfig back = hf_config_from_json(json::parse(hf_config_to_json(llama, DType::f32).dump()), "export");
  same(llama, back.model, "Llama 3.2 1B");
  EXPECT_EQ(back.max_positions, 131072);
  EXPECT_TRUE(back.unused.empty());
  GptConfig qwen3 = GptConfig::preset("smollm-135m");
  qwen3.qk_norm = true, qwen3.qkv_bias = true, qwen3.o_bias = false;
  EXPECT_THROW(hf_config_to_json(qwen3, DType::f32), InvalidArgument);
}

TEST(HfConfig, Gpt2ReadsItsShapeAndNamesItsDropoutAsUnused) {
  const json j = json::parse(R"({"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1,
    "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
    "summary_use_proj": true, "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
    "vocab_size": 50257})");
  const HfModelConfig hf = hf_config_from_json(j, "config.json");
  EXPECT_FALSE(hf.model.llama());
  EXPECT_EQ(hf.model.n_embd, 768);
  EXPECT_EQ(hf.max_positions, 1024);
  EXPECT_EQ(hf.unused.size(), 9u);  // three dropouts, five summary keys, task_specific_params
}

// Through a training config: model.hf_config (the file or its folder) gives the shape; the run's
// seq_len stays the config's, within the file's positions and Mistral's window.
TEST(HfConfig, ModelHfConfigInATrainingConfig) {
  const std::string dir = ::testing::TempDir() + "hf_config_test";
  std::filesystem::create_directories(dir);
  auto write = [&](const json& j) { std::ofstream(dir + "/config.json") << j.dump(); };
  write(llama32());
  const json base = json::parse(R"({"train_micro_batch_size_per_gpu": 1, "data": {"format": "synthetic", "vocab_size": 256},
                                    "model": {"seq_len": 64}})");
  json cfg = base;
  cfg["model"]["hf_config"] = dir;
  const TrainConfig t = TrainConfig::from_json(cfg);
  EXPECT_EQ(t.model.n_layer, 16);
  EXPECT_EQ(t.model.seq_len, 64);
  cfg["model"]["n_layer"] = 2;
  try {
    TrainConfig::from_json(cfg);
    ADD_FAILURE() << "n_layer beside hf_config was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(message(e), "model.n_layer comes from model.hf_config (" + dir + "); drop it from the config");
  }
  json mistral = llama32();
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["sliding_window"] = 32;
  mistral.erase("rope_scaling");
  write(mistral);
  cfg = base;
  cfg["model"]["hf_config"] = dir + "/config.json";
  try {
    TrainConfig::from_json(cfg);
    ADD_FAILURE() << "a sliding window shorter than seq_len was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(
        message(e),
        "model.seq_len 64 is longer than the sliding window (32) of MistralForCausalLM; zeroth attends to the whole sequence, so "
        "train with model.seq_len at most 32");
  }
  cfg["model"]["seq_len"] = 32;
  EXPECT_EQ(TrainConfig::from_json(cfg).model.seq_len, 32);
}

TEST(ModelSection, LlamaKeysBelongToTheLlamaFamily) {
  const json j = json::parse(R"({"train_micro_batch_size_per_gpu": 1, "model": {"n_layer": 1, "n_head": 2, "n_embd": 16,
                                 "n_kv_head": 1}})");
  try {
    TrainConfig::from_json(j);
    ADD_FAILURE() << "n_kv_head on GPT-2 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(message(e),
              "model.n_kv_head belongs to the Llama family; GPT-2 has no such setting (set model.architecture to \"llama\")");
  }
  json l = j;
  l["model"]["architecture"] = "llama";
  l["model"]["intermediate_size"] = 40;
  l["model"]["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  const TrainConfig t = TrainConfig::from_json(l);
  EXPECT_TRUE(t.model.llama());
  EXPECT_EQ(t.model.kv_heads(), 1);
  EXPECT_EQ(t.model.ffn(), 40);
  EXPECT_EQ(t.model.rope_scaling.type, RopeScaling::Type::linear);
  // The resolved config (what a checkpoint keeps) gives the same model back.
  const GptConfig again = TrainConfig::from_json(t.resolved).model;
  EXPECT_EQ(again.rope_scaling.type, RopeScaling::Type::linear);
  EXPECT_EQ(again.rope_scaling.factor, 2.0);
  EXPECT_EQ(again.num_parameters(), t.model.num_parameters());
  EXPECT_EQ(again.describe(), t.model.describe());
}

// Mixtral 8x7B's config.json as published (mistralai/Mixtral-8x7B-v0.1): every layer 8 SwiGLU experts,
// top 2, renormalised and dropless; 46,702,792,704 parameters, 12.9B of them met by a token.
json mixtral() {
  return json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0", "use_cache": true,
    "vocab_size": 32000})");
}

TEST(HfConfig, MixtralReadsItsExpertsAndWritesThemBack) {
  const HfModelConfig hf = hf_config_from_json(mixtral(), "config.json");
  const GptConfig& c = hf.model;
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.every, 1);
  EXPECT_TRUE(c.moe.normalize_top_k);
  EXPECT_FALSE(c.moe.drop_tokens);
  EXPECT_EQ(c.moe.aux_loss_coef, 0.0) << "Hugging Face adds its loss only with output_router_logits";
  EXPECT_EQ(c.expert_ffn(), 14336);
  EXPECT_EQ(c.num_parameters(), size_t{46702792704});
  EXPECT_EQ(c.active_parameters(), size_t{12879925248});
  EXPECT_EQ(c.hf_architecture(), "MixtralForCausalLM");
  json with_aux = mixtral();
  with_aux["output_router_logits"] = true;
  EXPECT_EQ(hf_config_from_json(with_aux, "config.json").model.moe.aux_loss_coef, 0.02);
  const HfModelConfig back = hf_config_from_json(json::parse(hf_config_to_json(c, DType::bf16).dump()), "export");
  EXPECT_EQ(back.model.describe(), c.describe());
  EXPECT_EQ(back.model.num_parameters(), c.num_parameters());
  json jitter = mixtral();
  jitter["router_jitter_noise"] = 0.1;
  EXPECT_THROW(hf_config_from_json(jitter, "config.json"), ConfigError);
  // A mixture Hugging Face has no class for (capacity drops) has no config.json.
  GptConfig dropping = c;
  dropping.moe.drop_tokens = true;
  EXPECT_EQ(dropping.hf_architecture(), "");
  EXPECT_THROW(hf_config_to_json(dropping, DType::f32), InvalidArgument);
}

// Qwen3-30B-A3B's config.json as published (Qwen/Qwen3-30B-A3B): Qwen3's attention with per-head
// q/k norms, every layer 128 SwiGLU experts of 768, top 8 renormalised, dropless; its model card's
// 30.5B parameters, 3.3B activated: 30,532,122,624 and 3,353,032,704 counted by hand (48 layers of
// attention 18,874,368 + norms 4,352 + router 262,144 + experts 128 x 4,718,592; embedding and
// head 311,164,928 each; the final norm 2,048).
json qwen3_moe() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

TEST(HfConfig, Qwen3MoeReadsItsExpertsAndWritesThemBack) {
  const HfModelConfig hf = hf_config_from_json(qwen3_moe(), "config.json");
  const GptConfig& c = hf.model;
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.moe.num_experts, 128);
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_EQ(c.moe.every, 1);
  EXPECT_TRUE(c.moe.normalize_top_k);
  EXPECT_FALSE(c.moe.drop_tokens);
  EXPECT_EQ(c.expert_ffn(), 768);
  EXPECT_EQ(c.ffn(), 6144);
  EXPECT_EQ(c.num_parameters(), size_t{30532122624});
  EXPECT_EQ(c.active_parameters(), size_t{3353032704});
  EXPECT_EQ(c.hf_architecture(), "Qwen3MoeForCausalLM");
  const auto back_json = hf_config_to_json(c, DType::bf16);
  EXPECT_EQ(back_json["model_type"], "qwen3_moe");
  EXPECT_EQ(back_json["moe_intermediate_size"], 768);
  EXPECT_EQ(back_json["intermediate_size"], 6144);
  const HfModelConfig back = hf_config_from_json(json::parse(back_json.dump()), "export");
  EXPECT_EQ(back.model.describe(), c.describe());
  EXPECT_EQ(back.model.num_parameters(), c.num_parameters());
  // Hugging Face's names: the router mlp.gate, the experts mlp.experts.N.gate_proj/up_proj/down_proj.
  GptConfig small = c;
  small.n_layer = 1, small.moe.num_experts = 2, small.vocab_size = 16, small.n_embd = 32, small.n_head = 2, small.n_kv_head = 1;
  small.head_dim = 16, small.intermediate_size = 64, small.moe.intermediate_size = 8, small.moe.top_k = 1;
  std::vector<std::string> names;
  for (const auto& p : Gpt::hf_params(small)) names.push_back(p.name);
  for (const char* n : {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.1.gate_proj.weight",
                        "model.layers.0.mlp.experts.1.up_proj.weight", "model.layers.0.mlp.experts.0.down_proj.weight",
                        "model.layers.0.self_attn.q_norm.weight"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  json sparse = qwen3_moe();
  sparse["decoder_sparse_step"] = 2;
  const GptConfig half = hf_config_from_json(sparse, "config.json").model;
  EXPECT_FALSE(half.moe_layer(0));
  EXPECT_TRUE(half.moe_layer(1));
  json dense_layers = qwen3_moe();
  dense_layers["mlp_only_layers"] = {0, 1};
  EXPECT_THROW(hf_config_from_json(dense_layers, "config.json"), ConfigError);
}

TEST(ModelSection, MoeKeysAndTheirErrors) {
  const json base = json::parse(R"({"train_micro_batch_size_per_gpu": 1, "model": {"n_layer": 4, "n_head": 2, "n_embd": 16,
                                    "moe": {"num_experts": 4, "top_k": 1, "every": 2, "capacity_factor": 1.5,
                                            "drop_tokens": true, "z_loss_coef": 0.001}}})");
  const TrainConfig t = TrainConfig::from_json(base);
  EXPECT_EQ(t.model.moe.num_experts, 4);
  EXPECT_EQ(t.model.moe.top_k, 1);
  EXPECT_FALSE(t.model.moe_layer(0));
  EXPECT_TRUE(t.model.moe_layer(1));
  EXPECT_TRUE(t.model.moe_layer(3));
  EXPECT_EQ(t.model.moe.capacity_factor, 1.5);
  EXPECT_EQ(t.model.moe.aux_loss_coef, 0.01);  // DeepSpeed-MoE's default
  EXPECT_EQ(TrainConfig::from_json(t.resolved).model.describe(), t.model.describe()) << "the resolved config keeps the experts";
  // Renormalised by default with top 2 and more (DeepSpeed's top-2 and top-k gates), not with top 1.
  EXPECT_FALSE(t.model.moe.normalize_top_k);
  json two = base;
  two["model"]["moe"]["top_k"] = 2;
  EXPECT_TRUE(TrainConfig::from_json(two).model.moe.normalize_top_k);
  EXPECT_TRUE(TrainConfig::from_json(TrainConfig::from_json(two).resolved).model.moe.normalize_top_k);
  two["model"]["moe"]["normalize_top_k"] = false;
  EXPECT_FALSE(TrainConfig::from_json(two).model.moe.normalize_top_k);
  auto error_of = [&](const json& j) {
    try {
      TrainConfig::from_json(j);
    } catch (const ConfigError& e) {
      return message(e);
    }
    return std::string("no error");
  };
  json j = base;
  j["model"]["moe"]["top_k"] = 5;
  EXPECT_EQ(error_of(j), "model.moe.top_k must be an integer in [1, 4] (num_experts), got 5");
  j = base;
  j["model"]["moe"]["capacity_facter"] = 2;
  EXPECT_NE(error_of(j).find("did you mean 'capacity_factor'"), std::string::npos) << error_of(j);
  // With tensor parallelism the router and the experts are replicated over its ranks.
  j = base;
  j["parallel"] = {{"tensor", 2}};
  j["model"]["n_head"] = 4;
  j["run"] = {{"world_size", 2}};
  EXPECT_EQ(error_of(j), "no error");
  GptPart tp = TrainConfig::from_json(j).part(0, 1);
  for (const auto& block : Gpt::block_specs(TrainConfig::from_json(j).model, tp)) {
    for (const auto& p : block.params) {
      if (p.name.find("router") != std::string::npos || block.name.ends_with(".experts")) {
        EXPECT_TRUE(p.tp.replicated() && !p.tp_partial_grad) << block.name << "." << p.name;
      }
    }
  }
  // parallel.expert: kept in the resolved config; each way it cannot hold named.
  j = base;
  j["parallel"] = {{"expert", 2}};
  j["run"] = {{"world_size", 4}};
  const TrainConfig ep = TrainConfig::from_json(j);
  EXPECT_EQ(ep.parallel.expert, 2);
  EXPECT_EQ(TrainConfig::from_json(ep.resolved).parallel.expert, 2);
  EXPECT_EQ(ep.part(0, 0, 3).ep_rank, 1);
  EXPECT_TRUE(ep.part(0, 0, 3).ep_overlap) << "the all-to-alls overlap by default";
  j["parallel"]["expert_overlap"] = false;
  const TrainConfig serial = TrainConfig::from_json(j);
  EXPECT_FALSE(serial.part(0, 0, 3).ep_overlap);
  EXPECT_FALSE(TrainConfig::from_json(serial.resolved).parallel.expert_overlap);
  j["parallel"]["expert_overlap"] = "no";
  EXPECT_NE(error_of(j).find("expert_overlap"), std::string::npos) << error_of(j);
  j["parallel"] = {{"expert", 2}};
  j["run"] = {{"world_size", 3}};
  EXPECT_NE(error_of(j).find("parallel.expert = 2 must divide the data-parallel size, 3"), std::string::npos) << error_of(j);
  j["run"] = {{"world_size", 3}};
  j["parallel"] = {{"expert", 3}};
  EXPECT_NE(error_of(j).find("so it must divide model.moe.num_experts, which is 4"), std::string::npos) << error_of(j);
  j = base;
  j["model"].erase("moe");
  j["parallel"] = {{"expert", 2}};
  j["run"] = {{"world_size", 2}};
  EXPECT_NE(error_of(j).find("but the model has no expert layers"), std::string::npos) << error_of(j);
}

// The presets' counts as the publishers give them (each model's num_parameters()).
TEST(ModelPresets, CountTheLlamaFamilysParametersExactly) {
  const std::pair<const char*, size_t> published[] = {{"smollm-135m", 134515008},     {"smollm-360m", 361821120},
                                                      {"qwen2.5-0.5b", 494032768},    {"llama-3.2-1b", 1235814400},
                                                      {"tinyllama-1.1b", 1100048384}, {"llama-2-7b", 6738415616},
                                                      {"llama-3-8b", 8030261248},     {"llama-3-70b", 70553706496}};
  for (const auto& [name, count] : published) EXPECT_EQ(GptConfig::preset(name).num_parameters(), count) << name;
}

}  // namespace
}  // namespace zeroth
