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
  for (const auto& t : lora_targets(c, layer)) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(t.in));
    b.params.push_back({t.module + ".lora_A.weight", {r, t.in}, InitRule::uniform(-bound, bound), ParamRole::weight});
    b.params.push_back({t.module + ".lora_B.weight", {t.out, r}, InitRule::zeros(), ParamRole::weight});
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

// The product's output width on this rank, and where a module's columns start in it.
int product_width(const Dims& d, LoraProduct p) {
  switch (p) {
    case LoraProduct::qkv: return d.W;
    case LoraProduct::mlp_up: return d.up();
    case LoraProduct::attn_out:
    case LoraProduct::mlp_down: return d.C;
  }
  return 0;
}

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

std::array<size_t, 5> lora_scratch_parts(const GptConfig& c, const Dims& d, size_t BT) {
  if (!c.lora.enabled()) return {};
  size_t out = 0, in = 0, stage = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    for (const auto& t : lora_targets(c, l)) {
      const auto [i, o] = local_shape(d, t);
      in = std::max<size_t>(in, i), out = std::max<size_t>(out, o);
      if (o != product_width(d, t.product)) stage = std::max<size_t>(stage, product_width(d, t.product));
    }
  }
  const size_t r = static_cast<size_t>(c.lora.r);
  return {BT * r, BT * r, BT * out, BT * stage, BT * in};
}

size_t lora_scratch_floats(const GptConfig& c, const Dims& d, size_t BT) {
  size_t n = 0;
  for (size_t part : lora_scratch_parts(c, d, BT)) n += part;
  return n;
}

void place_lora_scratch(LayerLora& lora, const std::array<size_t, 5>& parts, float* at) {
  float** into[] = {&lora.h, &lora.dh, &lora.t, &lora.stage, &lora.dx};
  for (size_t i = 0; i < parts.size(); ++i) *into[i] = at, at += parts[i];
}

LayerLora layer_lora(const GptConfig& c, const Dims& d, int layer, const std::vector<ParamSpec>& params, const float* values,
                     float* grads) {
  LayerLora out;
  out.r = c.lora.r;
  out.scale = static_cast<float>(c.lora.scale());
  const auto targets = lora_targets(c, layer);
  size_t at = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto [in, o] = local_shape(d, targets[i]);
    LoraModule m{targets[i].product, in, o, module_column(d, targets[i].module)};
    m.A = values + at, m.dA = grads + at;
    at += params.at(2 * i).numel();
    m.B = values + at, m.dB = grads + at;
    at += params.at(2 * i + 1).numel();
    out.modules.push_back(m);
  }
  return out;
}

void lora_forward(Kernels& k, const LayerLora* lora, LoraProduct product, const float* X, float* Y, size_t BT, int ld) {
  if (lora == nullptr) return;
  const LayerLora& L = *lora;
  bool staged = false;
  for (const auto& m : L.modules) {
    if (m.product != product) continue;
    k.matmul_forward(L.h, X, m.A, nullptr, BT, m.in, L.r);
    if (m.out == ld) {
      k.matmul_forward(L.t, L.h, m.B, nullptr, BT, L.r, m.out);
      k.add_scaled(Y, L.scale, L.t, BT * static_cast<size_t>(ld));
      continue;
    }
    // A module of a fused product (q of qkv, gate of gate|up): its columns of the rows, staged.
    if (!staged) k.zero(L.stage, BT * static_cast<size_t>(ld));
    staged = true;
    k.matmul_forward(L.t, L.h, m.B, nullptr, BT, L.r, m.out);
    k.copy_2d(L.stage + m.col, ld, L.t, m.out, BT, m.out);
  }
  if (staged) k.add_scaled(Y, L.scale, L.stage, BT * static_cast<size_t>(ld));
}

void lora_backward(Kernels& k, const LayerLora* lora, LoraProduct product, const float* X, const float* dY, float* dX, size_t BT,
                   int ld) {
  if (lora == nullptr) return;
  const LayerLora& L = *lora;
  for (const auto& m : L.modules) {
    if (m.product != product) continue;
    k.matmul_forward(L.h, X, m.A, nullptr, BT, m.in, L.r);  // made again: r values a row
    // t = scale dY over the module's columns; then dh = t B, dB += t^T h, dx = dh A, dA += dh^T X.
    k.copy_2d(L.t, m.out, dY + m.col, ld, BT, m.out);
    k.scale(L.t, L.scale, BT * static_cast<size_t>(m.out));
    k.matmul_backward(L.dh, m.dB, nullptr, L.t, L.h, m.B, BT, L.r, m.out);
    k.matmul_backward(L.dx, m.dA, nullptr, L.dh, X, m.A, BT, m.in, L.r);
    k.accumulate(dX, L.dx, BT * static_cast<size_t>(m.in));
  }
}

}  // namespace gpt
}  // namespace zeroth
