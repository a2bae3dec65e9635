// The GPT's blocks: the parameters of each block (with their tensor-parallel cuts, and an expert
// layer's router and experts), how a pipeline stage's part is laid out and checked, layer
// partitions, and the block schedules the engine plans with. The configuration's presets and
// checks are in gpt_config.cc, the passes in gpt_step.cc, the activation memory in activations.cc.
#include "models/decoder/gpt.h"

#include <algorithm>  // std::find
#include <cmath>      // std::sqrt

#include <fmt/format.h>  // fmt::join
#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"             // ZEROTH_THROW
#include "models/decoder/layers.h"  // gpt::complete_part, gpt::part_blocks
#include "models/decoder/lora.h"    // gpt::lora_spec, gpt::lora_cut

namespace zeroth {

// ---- blocks ---------------------------------------------------------------------------------

namespace gpt {

GptPart complete_part(const GptPart& part, const GptConfig& c) {
  if (!part.chunks.empty()) return part;
  GptPart whole = part;
  whole.chunks = {{0, c.n_layer}};
  return whole;
}

PartBlocks part_blocks(const GptConfig& c, const GptPart& part) {
  PartBlocks out;
  out.layers.assign(c.n_layer, -1);
  int next = 0;
  if (part.has_embedding()) out.embed = next++;
  out.experts.assign(c.n_layer, -1);
  out.lora.assign(c.n_layer, -1);
  out.expert_lora.assign(c.n_layer, -1);
  const bool expert_adapters = c.lora.enabled() && !expert_lora_targets(c).empty();
  for (const auto& [lo, hi] : part.chunks) {
    for (int l = lo; l < hi; ++l) {
      out.layers[l] = next++;
      if (c.moe_layer(l)) out.experts[l] = next++;
      if (c.lora.enabled()) out.lora[l] = next++;
      if (expert_adapters && c.moe_layer(l)) out.expert_lora[l] = next++;
    }
  }
  if (part.has_head(c)) {
    out.ln_f = next++;
    if (!c.tie_word_embeddings) {
      out.head = next++;
    } else {
      if (out.embed < 0) out.embed = next++;
      out.head = out.embed;
    }
  }
  return out;
}

}  // namespace gpt


namespace {

// A Llama-family layer in Hugging Face's names. q/k/v (weights, and biases) and gate/up are fused
// runs: the model multiplies by each run as one matrix, the queries', keys' and values' rows (the
// gate's and up's) one after the other.
BlockSpec llama_layer_spec(const GptConfig& c, int l) {
  const int64_t C = c.n_embd, hs = c.head_size(), Q = static_cast<int64_t>(c.n_head) * hs,
                KV = static_cast<int64_t>(c.kv_heads()) * hs, F = c.ffn();
  auto fused = [](ParamSpec p) {
    p.fused_with_next = true;
    return p;
  };
  const InitRule w = InitRule::normal(0.02);
  BlockSpec b{"layers." + std::to_string(l), {}};
  auto& p = b.params;
  p.push_back({"input_layernorm.weight", {C}, InitRule::constant(1), ParamRole::norm});
  p.push_back(fused({"self_attn.q_proj.weight", {Q, C}, w, ParamRole::weight}));
  p.push_back(fused({"self_attn.k_proj.weight", {KV, C}, w, ParamRole::weight}));
  p.push_back({"self_attn.v_proj.weight", {KV, C}, w, ParamRole::weight});
  if (c.qkv_bias) {
    p.push_back(fused({"self_attn.q_proj.bias", {Q}, InitRule::zeros(), ParamRole::bias}));
    p.push_back(fused({"self_attn.k_proj.bias", {KV}, InitRule::zeros(), ParamRole::bias}));
    p.push_back({"self_attn.v_proj.bias", {KV}, InitRule::zeros(), ParamRole::bias});
  }
  if (c.qk_norm) {
    p.push_back({"self_attn.q_norm.weight", {hs}, InitRule::constant(1), ParamRole::norm});
    p.push_back({"self_attn.k_norm.weight", {hs}, InitRule::constant(1), ParamRole::norm});
  }
  p.push_back({"self_attn.o_proj.weight", {C, Q}, w, ParamRole::weight});
  if (c.o_bias) p.push_back({"self_attn.o_proj.bias", {C}, InitRule::zeros(), ParamRole::bias});
  p.push_back({"post_attention_layernorm.weight", {C}, InitRule::constant(1), ParamRole::norm});
  if (c.moe_layer(l)) {
    // The router (Mixtral's name, or Qwen3-MoE's with its per-head norms); the experts are a block of
    // their own (experts_spec).
    p.push_back({c.qk_norm ? "mlp.gate.weight" : "block_sparse_moe.gate.weight", {c.moe.num_experts, C}, w, ParamRole::weight});
    return b;
  }
  p.push_back(fused({"mlp.gate_proj.weight", {F, C}, w, ParamRole::weight}));
  p.push_back({"mlp.up_proj.weight", {F, C}, w, ParamRole::weight});
  p.push_back({"mlp.down_proj.weight", {C, F}, w, ParamRole::weight});
  return b;
}

BlockSpec layer_spec(const GptConfig& c, int l) {
  if (c.llama()) return llama_layer_spec(c, l);
  const int64_t C = c.n_embd;
  const double proj_std = 0.02 / std::sqrt(2.0 * c.n_layer);  // GPT-2: residual projections scaled by depth
  if (c.moe_layer(l)) {
    // The attention and norms as GPT-2's; the MLP a router and experts shaped as GPT-2's MLP.
    GptConfig dense = c;
    dense.moe = {};
    BlockSpec b = layer_spec(dense, l);
    b.params.resize(8);  // up to ln_2
    b.params.push_back({"mlp.router.weight", {c.moe.num_experts, C}, InitRule::normal(0.02), ParamRole::weight});
    return b;
  }
  return {"h." + std::to_string(l),
          {{"ln_1.weight", {C}, InitRule::constant(1), ParamRole::norm},
           {"ln_1.bias", {C}, InitRule::zeros(), ParamRole::norm},
           {"attn.c_attn.weight", {3 * C, C}, InitRule::normal(0.02), ParamRole::weight},
           {"attn.c_attn.bias", {3 * C}, InitRule::zeros(), ParamRole::bias},
           {"attn.c_proj.weight", {C, C}, InitRule::normal(proj_std), ParamRole::weight},
           {"attn.c_proj.bias", {C}, InitRule::zeros(), ParamRole::bias},
           {"ln_2.weight", {C}, InitRule::constant(1), ParamRole::norm},
           {"ln_2.bias", {C}, InitRule::zeros(), ParamRole::norm},
           {"mlp.c_fc.weight", {4 * C, C}, InitRule::normal(0.02), ParamRole::weight},
           {"mlp.c_fc.bias", {4 * C}, InitRule::zeros(), ParamRole::bias},
           {"mlp.c_proj.weight", {C, 4 * C}, InitRule::normal(proj_std), ParamRole::weight},
           {"mlp.c_proj.bias", {C}, InitRule::zeros(), ParamRole::bias}}};
}

// An expert layer's experts that `part` holds, by their names in the whole model (for the Llama
// family Mixtral's, w1 (gate) and w3 (up) as one run, then w2 (down), or with per-head q/k norms
// Qwen3-MoE's gate_proj, up_proj, down_proj; GPT-2's MLP's otherwise), so a parameter keeps its
// name and seeded values whatever the expert-parallel size.
BlockSpec experts_spec(const GptConfig& c, int l, const GptPart& part) {
  const int64_t C = c.n_embd, X = c.expert_ffn();
  const double proj_std = c.llama() ? 0.02 : 0.02 / std::sqrt(2.0 * c.n_layer);
  const int n = c.moe.num_experts / part.ep_ranks;
  BlockSpec b{(c.llama() ? "layers." : "h.") + std::to_string(l) + ".experts", {}};
  b.expert_parallel = part.ep_ranks;
  const InitRule w = InitRule::normal(0.02);
  for (int e = part.ep_rank * n; e < (part.ep_rank + 1) * n; ++e) {
    if (c.llama()) {
      const bool qwen = c.qk_norm;
      const std::string expert = (qwen ? "mlp.experts." : "block_sparse_moe.experts.") + std::to_string(e) + ".";
      ParamSpec gate{expert + (qwen ? "gate_proj.weight" : "w1.weight"), {X, C}, w, ParamRole::weight};
      gate.fused_with_next = true;
      b.params.push_back(std::move(gate));
      b.params.push_back({expert + (qwen ? "up_proj.weight" : "w3.weight"), {X, C}, w, ParamRole::weight});
      b.params.push_back({expert + (qwen ? "down_proj.weight" : "w2.weight"), {C, X}, w, ParamRole::weight});
    } else {
      const std::string expert = "mlp.experts." + std::to_string(e) + ".";
      b.params.push_back({expert + "c_fc.weight", {X, C}, w, ParamRole::weight});
      b.params.push_back({expert + "c_fc.bias", {X}, InitRule::zeros(), ParamRole::bias});
      b.params.push_back({expert + "c_proj.weight", {C, X}, InitRule::normal(proj_std), ParamRole::weight});
      b.params.push_back({expert + "c_proj.bias", {C}, InitRule::zeros(), ParamRole::bias});
    }
  }
  return b;
}

BlockSpec embed_spec(const GptConfig& c) {
  const int64_t V = c.vocab_size, T = c.seq_len, C = c.n_embd;
  if (c.llama()) return {"embed", {{"wte", {V, C}, InitRule::normal(0.02), ParamRole::embedding}}};
  return {"embed",
          {{"wte", {V, C}, InitRule::normal(0.02), ParamRole::embedding},
           {"wpe", {T, C}, InitRule::normal(0.02), ParamRole::embedding}}};
}

// The untied LM head.
BlockSpec head_spec(const GptConfig& c) {
  return {"lm_head", {{"weight", {c.vocab_size, c.n_embd}, InitRule::normal(0.02), ParamRole::weight}}};
}

BlockSpec ln_f_spec(const GptConfig& c) {
  const int64_t C = c.n_embd;
  if (c.llama()) return {"ln_f", {{"weight", {C}, InitRule::constant(1), ParamRole::norm}}};
  return {"ln_f", {{"weight", {C}, InitRule::constant(1), ParamRole::norm}, {"bias", {C}, InitRule::zeros(), ParamRole::norm}}};
}

// Megatron-LM's split of a parameter ([out, in] matrices): QKV (in three segments: q, k, v, each
// cut by heads) and MLP-up by output rows (column-parallel), the attention output and MLP-down by
// input columns (row-parallel), the token embedding by vocabulary rows. The rest is replicated; a
// LayerNorm's gradient is a partial sum over the ranks when each holds only its rows of the
// sequence. The row-parallel biases' gradients come from the gathered rows: whole on every rank.
ParamSpec tensor_parallel_cut(const ParamSpec& p, const GptPart& part) {
  const int r = part.tp_rank, n = part.tp_ranks;
  const bool sp = part.sequence_parallel;
  const std::string& name = p.name;
  auto in = [&](std::initializer_list<const char*> names) {
    for (const char* k : names)
      if (name == k) return true;
    return false;
  };
  // The Llama family: q, k and v each cut by heads (the rank's key/value heads serve its query
  // heads), gate and up by rows alike; a per-head norm's gradient sums the ranks' heads.
  if (in({"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.q_proj.bias",
          "self_attn.k_proj.bias", "self_attn.v_proj.bias", "mlp.gate_proj.weight", "mlp.up_proj.weight", "weight"}) &&
      p.role != ParamRole::norm)
    return p.cut(0, 1, r, n);
  if (in({"self_attn.o_proj.weight", "mlp.down_proj.weight"})) return p.cut(1, 1, r, n);
  if (in({"self_attn.q_norm.weight", "self_attn.k_norm.weight"})) return p.cut(-1, 1, r, n, true);
  if (name == "attn.c_attn.weight" || name == "attn.c_attn.bias") return p.cut(0, 3, r, n);
  if (name == "mlp.c_fc.weight" || name == "mlp.c_fc.bias" || name == "wte") return p.cut(0, 1, r, n);
  if (name == "attn.c_proj.weight" || name == "mlp.c_proj.weight") return p.cut(1, 1, r, n);
  const bool norm = p.role == ParamRole::norm;
  return p.cut(-1, 1, r, n, norm && sp);
}

const GptPart& or_whole(const GptPart& part, const GptConfig& c, GptPart& storage) {
  if (!part.chunks.empty()) return part;
  storage = gpt::complete_part(part, c);
  return storage;
}

}  // namespace

std::vector<int> partition_layers(const GptConfig& c, int parts, const std::string& method, const std::vector<int>& counts,
                                  int expert_ranks) {
  const int L = c.n_layer;
  if (parts < 1) ZEROTH_THROW(ConfigError, "pipeline: {} virtual stages; need at least one", parts);
  if (L < parts) {
    ZEROTH_THROW(
        ConfigError,
        "pipeline: {} virtual stages (stages x virtual_stages) but the model has {} layer{}; every virtual stage needs one: use "
        "fewer stages or virtual stages, or more layers (model.n_layer)",
        parts, L, L == 1 ? "" : "s");
  }
  std::vector<int> out(parts, L / parts);
  if (!counts.empty()) {
    int sum = 0;
    for (int n : counts) sum += n;
    bool positive = true;
    for (int n : counts) positive = positive && n >= 1;
    if (static_cast<int>(counts.size()) != parts || sum != L || !positive) {
      ZEROTH_THROW(
          ConfigError,
          "pipeline.partition_method: the list gives {} virtual stages holding {} layers; it needs {} counts of at least 1 that "
          "add up to model.n_layer = {}",
          counts.size(), sum, parts, L);
    }
    return counts;
  }
  if (method == "uniform") {
    for (int k = 0; k < L % parts; ++k) ++out[k];
    return out;
  }
  if (method != "parameters") {
    ZEROTH_THROW(ConfigError, "pipeline.partition_method \"{}\" is not one of \"parameters\", \"uniform\" or a list of layer counts",
                 method);
  }
  // Contiguous layers with the embedding's weight in front and ln_f's behind: the smallest
  // largest stage, by binary search on the bound, each stage filled greedily (at least one layer).
  const auto count = [](const BlockSpec& b) {
    size_t n = 0;
    for (const auto& p : b.params) n += p.numel();
    return n;
  };
  // The last stage also holds the LM head's copy of the tied embedding (with its own optimizer
  // state), as DeepSpeed counts a tied layer on each stage that has it.
  GptPart slice;  // a rank's share of the experts (every slice is the same size)
  slice.ep_ranks = expert_ranks;
  const auto layer_weight = [&](int l) { return count(layer_spec(c, l)) + (c.moe_layer(l) ? count(experts_spec(c, l, slice)) : 0); };
  size_t layer = 0;  // the lightest layer: the search's lower bound
  for (int l = 0; l < L; ++l) layer = l == 0 ? layer_weight(0) : std::min(layer, layer_weight(l));
  size_t all_layers = 0;
  for (int l = 0; l < L; ++l) all_layers += layer_weight(l);
  const size_t first = count(embed_spec(c));
  const size_t last = count(ln_f_spec(c)) + (!c.tie_word_embeddings ? count(head_spec(c)) : parts > 1 ? first : 0);
  auto fill = [&](size_t bound, std::vector<int>* take) {
    int l = 0;
    for (int k = 0; k < parts; ++k) {
      size_t load = (k == 0 ? first : 0);
      int n = 0;
      const int left_for_rest = parts - k - 1;
      while (l + n < L - left_for_rest && (n == 0 || load + layer_weight(l + n) + (l + n + 1 == L ? last : 0) <= bound)) {
        load += layer_weight(l + n);
        ++n;
      }
      if (take != nullptr) (*take)[k] = n;
      l += n;
    }
    return l == L;
  };
  size_t lo = layer, hi = first + last + all_layers;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (fill(mid, nullptr)) hi = mid;
    else lo = mid + 1;
  }
  fill(lo, &out);
  return out;
}

std::vector<BlockSpec> Gpt::block_specs(const GptConfig& c) { return block_specs(c, {}); }

std::vector<BlockSpec> Gpt::block_specs(const GptConfig& c, const GptPart& given) {
  c.validate();
  GptPart storage;
  const GptPart& part = or_whole(given, c, storage);
  gpt::check_part(c, part);
  std::vector<BlockSpec> out;
  if (part.has_embedding()) out.push_back(embed_spec(c));
  for (const auto& [lo, hi] : part.chunks) {
    for (int l = lo; l < hi; ++l) {
      out.push_back(layer_spec(c, l));
      if (c.moe_layer(l)) out.push_back(experts_spec(c, l, part));
      if (c.lora.enabled()) out.push_back(gpt::lora_spec(c, l));
      if (c.lora.enabled() && c.moe_layer(l) && !gpt::expert_lora_targets(c).empty())
        out.push_back(gpt::expert_lora_spec(c, l, part.ep_rank, part.ep_ranks));
    }
  }
  if (part.has_head(c)) {
    out.push_back(ln_f_spec(c));
    if (!c.tie_word_embeddings) out.push_back(head_spec(c));
    else if (!part.has_embedding()) out.push_back(embed_spec(c));  // the LM head's copy of the tied embedding
  }
  if (part.tp_ranks > 1) {
    for (auto& block : out) {
      for (auto& param : block.params)
        if (!gpt::lora_cut(c, param, part.tp_rank, part.tp_ranks)) param = tensor_parallel_cut(param, part);
    }
  }
  // LoRA trains its adapters alone.
  for (auto& block : out) {
    block.frozen = c.lora.enabled() ? !block.name.ends_with(".lora")
                                    : std::find(c.frozen_blocks.begin(), c.frozen_blocks.end(), block.name) != c.frozen_blocks.end();
  }
  return out;
}

int Gpt::embedding_block(const GptConfig& c, const GptPart& part) { return gpt::part_blocks(c, gpt::complete_part(part, c)).embed; }


namespace {
// An expert layer's experts are named in Hugging Face as its layer's parameters.
std::string layer_of(const std::string& block) {
  constexpr std::string_view kExperts = ".experts";
  return block.ends_with(kExperts) ? block.substr(0, block.size() - kExperts.size()) : block;
}
}  // namespace

std::vector<Gpt::HfParam> Gpt::hf_params(const GptConfig& c) {
  std::vector<HfParam> out;
  const auto specs = block_specs(c);
  for (size_t b = 0; b < specs.size(); ++b) {
    if (specs[b].name.ends_with(".lora")) continue;  // adapters: peft_params
    if (c.llama()) {
      // "embed" {wte}, "layers.<l>" with Hugging Face's own suffixes, "ln_f" {weight}, "lm_head" {weight}.
      const std::string block = layer_of(specs[b].name);
      for (size_t i = 0; i < specs[b].params.size(); ++i) {
        const std::string name = block == "embed"     ? "model.embed_tokens.weight"
                                 : block == "ln_f"    ? "model.norm.weight"
                                 : block == "lm_head" ? "lm_head.weight"
                                                      : "model." + block + "." + specs[b].params[i].name;
        out.push_back({static_cast<int>(b), i, name, false});
      }
      continue;
    }
    // "embed" {wte, wpe}, "h.<l>" with Hugging Face's own suffixes, "ln_f" {weight, bias}.
    const std::string prefix = specs[b].name == "embed" ? "transformer." : "transformer." + layer_of(specs[b].name) + ".";
    for (size_t i = 0; i < specs[b].params.size(); ++i) {
      const std::string& p = specs[b].params[i].name;
      const bool conv1d = p == "attn.c_attn.weight" || p == "attn.c_proj.weight" || p == "mlp.c_fc.weight" || p == "mlp.c_proj.weight";
      out.push_back({static_cast<int>(b), i, prefix + (specs[b].name == "embed" ? p + ".weight" : p), conv1d});
    }
  }
  return out;
}

BlockSchedule Gpt::schedule(const GptConfig& c) { return schedules(c, {}).front(); }

std::vector<BlockSchedule> Gpt::schedules(const GptConfig& c, const GptPart& given) {
  GptPart storage;
  const GptPart& part = or_whole(given, c, storage);
  gpt::check_part(c, part);
  const gpt::PartBlocks ids = gpt::part_blocks(c, part);
  std::vector<BlockSchedule> out;
  for (size_t k = 0; k < part.chunks.size(); ++k) {
    const auto [lo, hi] = part.chunks[k];
    const bool first = lo == 0, last = hi == c.n_layer;
    BlockSchedule s;
    if (first) s.forward.push_back(ids.embed);
    for (int l = lo; l < hi; ++l) {
      // A layer's adapters are copied for its passes by a use of their own just before, and their
      // gradients added by one just after its backward.
      if (ids.lora[l] >= 0) s.forward.push_back(ids.lora[l]);
      s.forward.push_back(ids.layers[l]);
      if (ids.expert_lora[l] >= 0) s.forward.push_back(ids.expert_lora[l]);
      if (ids.experts[l] >= 0) s.forward.push_back(ids.experts[l]);
    }
    if (last) {
      s.forward.push_back(ids.ln_f);
      s.forward.push_back(ids.head);  // the LM head (the embedding when tied)
      s.backward.push_back(ids.head);
      s.backward.push_back(ids.ln_f);
    }
    for (int l = hi - 1; l >= lo; --l) {
      if (ids.experts[l] >= 0) s.backward.push_back(ids.experts[l]);
      if (ids.expert_lora[l] >= 0) s.backward.push_back(ids.expert_lora[l]);
      s.backward.push_back(ids.layers[l]);
      if (ids.lora[l] >= 0) s.backward.push_back(ids.lora[l]);
    }
    if (first) s.backward.push_back(ids.embed);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace zeroth
