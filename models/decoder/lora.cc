// LoRA adapters: the targets a config names, their block, their tensor-parallel cut and their share
// of a layer's passes (lora.h).
#include "models/decoder/lora.h"

#include "models/decoder/layers.h"  // BoundRef

#include <algorithm>  // std::max, std::any_of
#include <array>      // std::array
#include <cmath>      // std::sqrt

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"  // ZEROTH_THROW

namespace zeroth {

double LoraConfig::scale() const { return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / r; }

namespace gpt {
namespace {

// Every linear layer of a dense block of the architecture, in the block's order.
std::vector<LoraTarget> all_targets(const GptConfig& c) {
  const int64_t C = c.n_embd, F = c.ffn();
  if (c.llama()) {
    const int64_t Q = static_cast<int64_t>(c.n_head) * c.head_size(), KV = static_cast<int64_t>(c.kv_heads()) * c.head_size();
    return {{"self_attn.q_proj", LoraProduct::qkv, C, Q, 0, 1},  {"self_attn.k_proj", LoraProduct::qkv, C, KV, 0, 1},
            {"self_attn.v_proj", LoraProduct::qkv, C, KV, 0, 1}, {"self_attn.o_proj", LoraProduct::attn_out, Q, C, 1, 1},
            {"mlp.gate_proj", LoraProduct::mlp_up, C, F, 0, 1},  {"mlp.up_proj", LoraProduct::mlp_up, C, F, 0, 1},
            {"mlp.down_proj", LoraProduct::mlp_down, F, C, 1, 1}};
  }
  return {{"attn.c_attn", LoraProduct::qkv, C, 3 * C, 0, 3},
          {"attn.c_proj", LoraProduct::attn_out, C, C, 1, 1},
          {"mlp.c_fc", LoraProduct::mlp_up, C, F, 0, 1},
          {"mlp.c_proj", LoraProduct::mlp_down, F, C, 1, 1}};
}

// PEFT's rule: a target names a module by its whole path or by its last parts.
bool names(const std::string& target, const std::string& module) {
  return target == "all-linear" || module == target || module.ends_with("." + target);
}

bool mlp(LoraProduct p) { return p == LoraProduct::mlp_up || p == LoraProduct::mlp_down; }

// Expert e's path in its layer, as the experts' block names its parameters.
std::string expert_path(const GptConfig& c, int e) {
  return (c.llama() && !c.qk_norm ? "block_sparse_moe.experts." : "mlp.experts.") + std::to_string(e) + ".";
}

// Every linear layer of an expert (none without expert layers), named under the expert's path.
std::vector<LoraTarget> all_expert_targets(const GptConfig& c) {
  if (!c.moe.enabled()) return {};
  const int64_t C = c.n_embd, X = c.expert_ffn();
  if (c.llama()) {
    const bool qwen = c.qk_norm;
    return {{qwen ? "gate_proj" : "w1", LoraProduct::mlp_up, C, X, 0, 1},
            {qwen ? "up_proj" : "w3", LoraProduct::mlp_up, C, X, 0, 1},
            {qwen ? "down_proj" : "w2", LoraProduct::mlp_down, X, C, 1, 1}};
  }
  return {{"c_fc", LoraProduct::mlp_up, C, X, 0, 1}, {"c_proj", LoraProduct::mlp_down, X, C, 1, 1}};
}

bool targeted(const GptConfig& c, const std::string& module) {
  return std::any_of(c.lora.target_modules.begin(), c.lora.target_modules.end(),
                     [&](const std::string& t) { return names(t, module); });
}

// Product by product, the targets' A (stacked: one product makes h for all of them), then their B,
// each named `prefix` + its module.
void append_adapters(BlockSpec& b, const std::vector<LoraTarget>& targets, const std::string& prefix, int64_t r) {
  for (LoraProduct p : {LoraProduct::qkv, LoraProduct::attn_out, LoraProduct::mlp_up, LoraProduct::mlp_down}) {
    for (const auto& t : targets) {
      if (t.product != p) continue;
      const double bound = 1.0 / std::sqrt(static_cast<double>(t.in));
      b.params.push_back({prefix + t.module + ".lora_A.weight", {r, t.in}, InitRule::uniform(-bound, bound), ParamRole::weight});
    }
    for (const auto& t : targets)
      if (t.product == p) b.params.push_back({prefix + t.module + ".lora_B.weight", {t.out, r}, InitRule::zeros(), ParamRole::weight});
  }
}

}  // namespace

std::vector<LoraTarget> lora_targets(const GptConfig& c, int layer) {
  const auto all = all_targets(c);
  const auto experts = all_expert_targets(c);
  for (const auto& t : c.lora.target_modules) {
    const bool dense = std::any_of(all.begin(), all.end(), [&](const LoraTarget& m) { return names(t, m.module); });
    const bool expert = std::any_of(experts.begin(), experts.end(),
                                    [&](const LoraTarget& m) { return names(t, expert_path(c, 0) + m.module); });
    if (!dense && !expert) {
      std::vector<std::string> known{"all-linear"};
      for (const auto& m : all) {
        const std::string name = m.module.substr(m.module.find('.') + 1);
        if (std::find(known.begin(), known.end(), name) == known.end()) known.push_back(name);
      }
      for (const auto& m : experts)
        if (std::find(known.begin(), known.end(), m.module) == known.end()) known.push_back(m.module);
      ZEROTH_THROW(ConfigError, "lora.target_modules names \"{}\", which {} has no linear layer of; its layers' are {}", t,
                   c.llama() ? "the Llama family" : "GPT-2", fmt::join(known, ", "));
    }
  }
  std::vector<LoraTarget> out;
  for (const auto& m : all) {
    // An expert layer has no MLP of its own: its experts' adapters are expert_lora_spec's.
    if (targeted(c, m.module) && !(mlp(m.product) && c.moe_layer(layer))) out.push_back(m);
  }
  return out;
}

std::vector<LoraTarget> expert_lora_targets(const GptConfig& c) {
  std::vector<LoraTarget> out;
  for (const auto& m : all_expert_targets(c))
    if (targeted(c, expert_path(c, 0) + m.module)) out.push_back(m);
  return out;
}

std::string lora_block_name(const GptConfig& c, int layer) { return (c.llama() ? "layers." : "h.") + std::to_string(layer) + ".lora"; }

BlockSpec lora_spec(const GptConfig& c, int layer) {
  BlockSpec b{lora_block_name(c, layer), {}};
  append_adapters(b, lora_targets(c, layer), "", c.lora.r);
  return b;
}

BlockSpec expert_lora_spec(const GptConfig& c, int layer, int ep_rank, int ep_ranks) {
  BlockSpec b{(c.llama() ? "layers." : "h.") + std::to_string(layer) + ".experts.lora", {}};
  b.expert_parallel = ep_ranks;
  const int n = c.moe.num_experts / ep_ranks;
  const auto targets = expert_lora_targets(c);
  for (int e = ep_rank * n; e < (ep_rank + 1) * n; ++e) append_adapters(b, targets, expert_path(c, e), c.lora.r);
  return b;
}

bool lora_cut(const GptConfig& c, ParamSpec& p, int rank, int ranks) {
  const bool a = p.name.ends_with(".lora_A.weight"), b = p.name.ends_with(".lora_B.weight");
  if (!a && !b) return false;
  const std::string module = p.name.substr(0, p.name.size() - std::string(".lora_A.weight").size());
  for (const auto& t : all_targets(c)) {
    if (t.module != module) continue;
    const bool column = t.axis == 0;
    if (column) {
      p = a ? p.cut(-1, 1, rank, ranks, true) : p.cut(0, t.groups, rank, ranks);
    } else {
      p = a ? p.cut(1, 1, rank, ranks) : p.cut(-1, 1, rank, ranks, true);
    }
    return true;
  }
  return false;
}

namespace {

// Where a module's columns start in its product's output rows on this rank.
int module_column(const Dims& d, const std::string& module) {
  if (module == "self_attn.k_proj") return d.NH * d.hs;
  if (module == "self_attn.v_proj") return (d.NH + d.KVH) * d.hs;
  if (module == "mlp.up_proj") return d.F;
  return 0;
}

// This rank's widths of a target's input and output.
std::array<int, 2> local_shape(const Dims& d, const LoraTarget& t) {
  switch (t.product) {
    case LoraProduct::qkv:
      if (t.module == "attn.c_attn") return {d.C, d.W};
      return {d.C, (t.module == "self_attn.q_proj" ? d.NH : d.KVH) * d.hs};
    case LoraProduct::attn_out: return {d.Cq, d.C};
    case LoraProduct::mlp_up: return {d.C, d.F};
    case LoraProduct::mlp_down: return {d.F, d.C};
  }
  return {0, 0};
}

}  // namespace

size_t LayerLora::floats() const {
  size_t n = 0;
  for (size_t v : sizes) n += v;
  return n;
}

namespace {

// Rows of h per product (or in all) of `targets`.
size_t rows_of(const std::vector<LoraTarget>& targets, int r, LoraProduct product, bool all) {
  size_t n = 0;
  for (const auto& t : targets)
    if (all || t.product == product) n += static_cast<size_t>(r);
  return n;
}

// The most rows of h any layer's adapters take, per product (or in all): an expert layer's lack the
// MLP's.
size_t lora_rows(const GptConfig& c, LoraProduct product, bool all) {
  size_t n = 0;
  for (int l = 0; l < c.n_layer; ++l) n = std::max(n, rows_of(lora_targets(c, l), c.lora.r, product, all));
  return n;
}

constexpr LoraProduct kProducts[] = {LoraProduct::qkv, LoraProduct::attn_out, LoraProduct::mlp_up, LoraProduct::mlp_down};

// A target with this rank's widths and its first column in its product's output.
struct Placed {
  LoraProduct product;
  int in, out, col;
};

// Adapters of `targets` whose parameters lie at params[i...] (the spec's order: per product, its
// modules' A, then their B), their values and gradients from `at` floats on; each product's h a
// region of `h_rows` rows after the previous products' (in units of rows: LoraProductSet::h_at).
LayerLora place(int r, float scale, const std::vector<Placed>& targets, const std::vector<ParamSpec>& params, size_t& i, size_t& at,
                const float* values, float* grads, float* scratch) {
  LayerLora out;
  out.r = r, out.scale = scale, out.dh = scratch;
  auto next = [&]() {
    const size_t n = params.at(i++).numel();
    out.sizes.push_back(n);
    at += n;
    return at - n;
  };
  size_t h_at = 0;
  for (LoraProduct p : kProducts) {
    LoraProductSet set;
    set.product = p;
    for (const auto& t : targets) {
      if (t.product != p) continue;
      const size_t a = next();
      if (set.A == nullptr) set.A = values + a, set.dA = grads + a;
      set.in = t.in;
      set.modules.push_back({t.out, t.col, set.rows, nullptr, nullptr});
      set.rows += r;
    }
    if (set.modules.empty()) continue;
    for (auto& m : set.modules) {
      const size_t b = next();
      m.B = values + b, m.dB = grads + b;
    }
    set.h_at = h_at;
    h_at += static_cast<size_t>(set.rows);
    out.products.push_back(std::move(set));
  }
  return out;
}

}  // namespace

size_t lora_h_floats(const GptConfig& c, size_t BT) { return c.lora.enabled() ? BT * lora_rows(c, LoraProduct::qkv, true) : 0; }

size_t lora_scratch_floats(const GptConfig& c, size_t BT) {
  if (!c.lora.enabled()) return 0;
  size_t widest = 0;
  for (LoraProduct p : kProducts) widest = std::max(widest, lora_rows(c, p, false));
  return BT * widest;
}

size_t expert_lora_h_floats(const GptConfig& c, size_t rows) {
  return c.lora.enabled() ? rows * rows_of(expert_lora_targets(c), c.lora.r, LoraProduct::qkv, true) : 0;
}

size_t expert_lora_scratch_floats(const GptConfig& c, size_t rows) {
  if (!c.lora.enabled()) return 0;
  size_t widest = 0;
  for (LoraProduct p : kProducts) widest = std::max(widest, rows_of(expert_lora_targets(c), c.lora.r, p, false));
  return rows * widest;
}

LayerLora layer_lora(const GptConfig& c, const Dims& d, int layer, const std::vector<ParamSpec>& params, const float* values,
                     float* grads, float* scratch) {
  std::vector<Placed> placed;
  for (const auto& t : lora_targets(c, layer)) {
    const auto [in, o] = local_shape(d, t);
    placed.push_back({t.product, in, o, module_column(d, t.module)});
  }
  size_t i = 0, at = 0;
  return place(c.lora.r, static_cast<float>(c.lora.scale()), placed, params, i, at, values, grads, scratch);
}

std::vector<LayerLora> experts_lora(const GptConfig& c, const Dims& d, const std::vector<ParamSpec>& params, const float* values,
                                    float* grads, float* scratch) {
  // An expert is whole on every tensor-parallel rank; the Llama family's w3 (up) columns follow w1's.
  std::vector<Placed> placed;
  for (const auto& t : expert_lora_targets(c)) {
    const bool up = t.module == "w3" || t.module == "up_proj";
    placed.push_back({t.product, static_cast<int>(t.in), static_cast<int>(t.out), up ? d.X : 0});
  }
  std::vector<LayerLora> out;
  size_t i = 0, at = 0;
  for (int j = 0; j < d.local_experts(); ++j)
    out.push_back(place(c.lora.r, static_cast<float>(c.lora.scale()), placed, params, i, at, values, grads, scratch));
  ZEROTH_CHECK(i == params.size(), "expert adapters: {} parameters laid out of the block's {}", i, params.size());
  return out;
}

void lora_forward(Kernels& k, const LayerLora* lora, LoraProduct product, const float* X, float* Y, size_t BT, int ld, float* h,
                  size_t h_rows, size_t row0) {
  if (lora == nullptr) return;
  const int n = static_cast<int>(BT);
  for (const auto& p : lora->products) {
    if (p.product != product) continue;
    // h = X A^T for every module at once, then each module's columns of Y += scale h_m B^T.
    float* hp = h + (h_rows > 0 ? h_rows : BT) * p.h_at + row0 * p.rows;
    k.gemm(false, true, n, p.rows, p.in, 1.0f, X, p.in, p.A, p.in, 0.0f, hp, p.rows);
    for (const auto& m : p.modules)
      k.gemm(false, true, n, m.out, lora->r, lora->scale, hp + m.hcol, p.rows, m.B, lora->r, 1.0f, Y + m.col, ld);
  }
}

void lora_backward(Kernels& k, const LayerLora* lora, LoraProduct product, const float* X, const float* dY, float* dX, size_t BT,
                   int ld, const float* h, size_t h_rows, size_t row0) {
  if (lora == nullptr) return;
  const int n = static_cast<int>(BT), r = lora->r;
  for (const auto& p : lora->products) {
    if (p.product != product) continue;
    const float* hp = h + (h_rows > 0 ? h_rows : BT) * p.h_at + row0 * p.rows;
    // Per module, its columns of dY: dh_m = scale dy B; dB += scale dy^T h_m. Then for all of them
    // at once dA += dh^T X and dX += dh A.
    for (const auto& m : p.modules) {
      k.gemm(false, false, n, r, m.out, lora->scale, dY + m.col, ld, m.B, r, 0.0f, lora->dh + m.hcol, p.rows);
      k.gemm(true, false, m.out, r, n, lora->scale, dY + m.col, ld, hp + m.hcol, p.rows, 1.0f, m.dB, r);
    }
    k.gemm(true, false, p.rows, p.in, n, 1.0f, lora->dh, p.rows, X, p.in, 1.0f, p.dA, p.in);
    k.gemm(false, false, n, p.in, p.rows, 1.0f, lora->dh, p.rows, p.A, p.in, 1.0f, dX, p.in);
  }
}

void copy_adapters(Kernels& k, BoundRef w, float* into, const std::vector<size_t>* sizes) {
  k.submit([&k, w, into, sizes] {
    size_t at = 0;
    for (size_t i = 0; i < sizes->size(); at += (*sizes)[i++]) k.copy(into + at, (*w)->p(i), (*sizes)[i]);
  });
}
void add_adapter_grads(Kernels& k, BoundRef w, const float* grads, const std::vector<size_t>* sizes) {
  k.submit([&k, w, grads, sizes] {
    size_t at = 0;
    for (size_t i = 0; i < sizes->size(); at += (*sizes)[i++]) k.accumulate((*w)->g(i), grads + at, (*sizes)[i]);
  });
}

}  // namespace gpt

std::vector<Gpt::HfParam> Gpt::peft_params(const GptConfig& c) {
  std::vector<HfParam> out;
  const auto specs = block_specs(c);
  for (size_t b = 0; b < specs.size(); ++b) {
    if (!specs[b].name.ends_with(".lora")) continue;
    // The layer's path (an expert's adapters are named under its layer, as the experts are).
    std::string layer = specs[b].name.substr(0, specs[b].name.size() - 5);
    if (layer.ends_with(".experts")) layer.resize(layer.size() - 8);
    const std::string prefix = std::string("base_model.model.") + (c.llama() ? "model." : "transformer.") + layer + ".";
    for (size_t i = 0; i < specs[b].params.size(); ++i)
      out.push_back({static_cast<int>(b), i, prefix + specs[b].params[i].name, false});
  }
  return out;
}

}  // namespace zeroth
