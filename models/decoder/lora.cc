// LoRA adapters: the targets a config names, their block, their tensor-parallel cut and their share
// of a layer's passes (lora.h).
#include "models/decoder/lora.h"

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

}  // namespace

std::vector<LoraTarget> lora_targets(const GptConfig& c, int layer) {
  const auto all = all_targets(c);
  for (const auto& t : c.lora.target_modules) {
    if (!std::any_of(all.begin(), all.end(), [&](const LoraTarget& m) { return names(t, m.module); })) {
      std::vector<std::string> known{"all-linear"};
      for (const auto& m : all) {
        const std::string name = m.module.substr(m.module.find('.') + 1);
        if (std::find(known.begin(), known.end(), name) == known.end()) known.push_back(name);
      }
      ZEROTH_THROW(ConfigError, "lora.target_modules names \"{}\", which {} has no linear layer of; its layers' are {}", t,
                   c.llama() ? "the Llama family" : "GPT-2", fmt::join(known, ", "));
    }
  }
  std::vector<LoraTarget> out;
  for (const auto& m : all) {
    const bool wanted = std::any_of(c.lora.target_modules.begin(), c.lora.target_modules.end(),
                                    [&](const std::string& t) { return names(t, m.module); });
    if (!wanted) continue;
    if (mlp(m.product) && c.moe_layer(layer)) {
      ZEROTH_THROW(ConfigError,
                   "lora.target_modules names {} but layer {} is an expert layer, whose MLP is its experts': adapters on experts "
                   "are not supported; target the attention's modules",
                   m.module, layer);
    }
    out.push_back(m);
  }
  return out;
}

std::string lora_block_name(const GptConfig& c, int layer) { return (c.llama() ? "layers." : "h.") + std::to_string(layer) + ".lora"; }

BlockSpec lora_spec(const GptConfig& c, int layer) {
  BlockSpec b{lora_block_name(c, layer), {}};
  const int64_t r = c.lora.r;
  // Product by product, the modules' A (stacked: one product makes h for all of them), then their B.
  const auto targets = lora_targets(c, layer);
  for (LoraProduct p : {LoraProduct::qkv, LoraProduct::attn_out, LoraProduct::mlp_up, LoraProduct::mlp_down}) {
    for (const auto& t : targets) {
      if (t.product != p) continue;
      const double bound = 1.0 / std::sqrt(static_cast<double>(t.in));
      b.params.push_back({t.module + ".lora_A.weight", {r, t.in}, InitRule::uniform(-bound, bound), ParamRole::weight});
    }
    for (const auto& t : targets)
      if (t.product == p) b.params.push_back({t.module + ".lora_B.weight", {t.out, r}, InitRule::zeros(), ParamRole::weight});
  }
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

// Rows of h per product and in all, of a layer's adapters (every dense layer's are alike).
size_t lora_rows(const GptConfig& c, LoraProduct product, bool all) {
  size_t n = 0;
  for (const auto& t : lora_targets(c, 0))
    if (all || t.product == product) n += static_cast<size_t>(c.lora.r);
  return n;
}

}  // namespace

size_t lora_h_floats(const GptConfig& c, size_t BT) { return c.lora.enabled() ? BT * lora_rows(c, LoraProduct::qkv, true) : 0; }

size_t lora_scratch_floats(const GptConfig& c, size_t BT) {
  if (!c.lora.enabled()) return 0;
  size_t widest = 0;
  for (LoraProduct p : {LoraProduct::qkv, LoraProduct::attn_out, LoraProduct::mlp_up, LoraProduct::mlp_down})
    widest = std::max(widest, lora_rows(c, p, false));
  return BT * widest;
}

LayerLora layer_lora(const GptConfig& c, const Dims& d, int layer, const std::vector<ParamSpec>& params, const float* values,
                     float* grads, float* scratch) {
  LayerLora out;
  out.r = c.lora.r;
  out.scale = static_cast<float>(c.lora.scale());
  out.dh = scratch;
  const auto targets = lora_targets(c, layer);
  size_t at = 0, i = 0, h_at = 0;
  auto next = [&]() {
    const size_t n = params.at(i++).numel();
    out.sizes.push_back(n);
    at += n;
    return at - n;
  };
  // The spec's order (lora_spec): per product, its modules' A, then their B.
  for (LoraProduct p : {LoraProduct::qkv, LoraProduct::attn_out, LoraProduct::mlp_up, LoraProduct::mlp_down}) {
    LoraProductSet set;
    set.product = p;
    for (const auto& t : targets) {
      if (t.product != p) continue;
      const auto [in, o] = local_shape(d, t);
      const size_t a = next();
      if (set.A == nullptr) set.A = values + a, set.dA = grads + a;
      set.in = in;
      set.modules.push_back({o, module_column(d, t.module), set.rows, nullptr, nullptr});
      set.rows += out.r;
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

void lora_forward(Kernels& k, const LayerLora* lora, LoraProduct product, const float* X, float* Y, size_t BT, int ld, float* h) {
  if (lora == nullptr) return;
  const int n = static_cast<int>(BT);
  for (const auto& p : lora->products) {
    if (p.product != product) continue;
    // h = X A^T for every module at once, then each module's columns of Y += scale h_m B^T.
    float* hp = h + BT * p.h_at;
    k.gemm(false, true, n, p.rows, p.in, 1.0f, X, p.in, p.A, p.in, 0.0f, hp, p.rows);
    for (const auto& m : p.modules)
      k.gemm(false, true, n, m.out, lora->r, lora->scale, hp + m.hcol, p.rows, m.B, lora->r, 1.0f, Y + m.col, ld);
  }
}

void lora_backward(Kernels& k, const LayerLora* lora, LoraProduct product, const float* X, const float* dY, float* dX, size_t BT,
                   int ld, const float* h) {
  if (lora == nullptr) return;
  const int n = static_cast<int>(BT), r = lora->r;
  for (const auto& p : lora->products) {
    if (p.product != product) continue;
    const float* hp = h + BT * p.h_at;
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

}  // namespace gpt
}  // namespace zeroth
