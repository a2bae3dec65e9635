// Optimizer names, state sizes, validation and DeepSpeed's `optimizer` section.
#include "optim/optimizer.h"

#include <algorithm>  // std::find
#include <cctype>     // std::tolower
#include <limits>     // std::numeric_limits

#include <nlohmann/json.hpp>

#include "core/config_section.h"
#include "core/error.h"
#include "core/strings.h"

namespace zeroth {

std::string_view optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::adam: return "Adam";
    case OptimizerKind::adamw: return "AdamW";
    case OptimizerKind::sgd: return "SGD";
    case OptimizerKind::lion: return "Lion";
    case OptimizerKind::lamb: return "Lamb";
  }
  return "invalid";
}

int OptimizerParams::state_arrays() const {
  switch (kind) {
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
    case OptimizerKind::lamb: return 2;
    case OptimizerKind::lion: return 1;
    case OptimizerKind::sgd: return momentum != 0.0 ? 1 : 0;
  }
  return 0;
}

std::string_view OptimizerParams::state_array_name(int array) const {
  ZEROTH_CHECK(array >= 0 && array < state_arrays(), "{} has {} state arrays, not #{}", optimizer_name(kind), state_arrays(), array);
  if (kind == OptimizerKind::sgd) return "momentum_buffer";
  return array == 0 ? "exp_avg" : "exp_avg_sq";
}

void OptimizerParams::validate() const {
  auto fail = [&](std::string_view key, auto value, std::string_view rule) {
    ZEROTH_THROW(ConfigError, "optimizer.params.{} = {} for {}: {}", key, value, optimizer_name(kind), rule);
  };
  if (!(lr >= 0.0)) fail("lr", lr, "must be >= 0");
  if (!(weight_decay >= 0.0)) fail("weight_decay", weight_decay, "must be >= 0");
  if (kind == OptimizerKind::sgd) {
    if (!(momentum >= 0.0)) fail("momentum", momentum, "must be >= 0");
    if (!(dampening >= 0.0 && dampening <= 1.0)) fail("dampening", dampening, "must be in [0, 1]");
    if (nesterov && (momentum <= 0.0 || dampening != 0.0)) {
      fail("nesterov", "true", "needs momentum > 0 and dampening 0 (as in PyTorch)");
    }
    return;
  }
  if (!(beta1 >= 0.0 && beta1 < 1.0)) fail("betas[0]", beta1, "must be in [0, 1)");
  if (!(beta2 >= 0.0 && beta2 < 1.0)) fail("betas[1]", beta2, "must be in [0, 1)");
  if (kind != OptimizerKind::lion && !(eps > 0.0)) fail("eps", eps, "must be > 0");
  if (kind == OptimizerKind::lamb) {
    if (!(min_coeff >= 0.0)) fail("min_coeff", min_coeff, "must be >= 0");
    if (!(max_coeff >= min_coeff)) fail("max_coeff", max_coeff, "must be >= min_coeff");
  }
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// A parameter's number: any value, the optimizer's validate() says which it takes.
double number(const ConfigSection& s, const char* key, double def) {
  return s.number(key, def, std::numeric_limits<double>::lowest(), std::numeric_limits<double>::max(), "a number");
}

}  // namespace

// Long: the optimizer types with their allowed keys, then each parameter read and checked in turn; the checks between
// parameters (adam_w_mode against the type) need both read in the same place.
OptimizerParams OptimizerParams::from_deepspeed(const nlohmann::json& section) {
  if (!section.is_object()) ZEROTH_THROW(ConfigError, "optimizer must be an object like {{\"type\": \"AdamW\", \"params\": {{...}}}}");
  for (const auto& [key, value] : section.items()) {
    static constexpr std::string_view kKeys[] = {"type", "params"};
    if (key != "type" && key != "params") {
      ZEROTH_THROW(ConfigError, "optimizer.{} is not a known key{}", key, did_you_mean(key, kKeys));
    }
  }
  if (!section.contains("type") || !section["type"].is_string()) {
    ZEROTH_THROW(ConfigError, "optimizer.type is required (Adam, AdamW, SGD, Lion or Lamb)");
  }
  const std::string type = section["type"].get<std::string>();
  const nlohmann::json params = section.value("params", nlohmann::json::object());
  if (!params.is_object()) ZEROTH_THROW(ConfigError, "optimizer.params must be an object");

  OptimizerParams p;
  std::vector<std::string_view> allowed;
  const std::string t = lower(type);
  if (t == "adam" || t == "adamw") {
    p.kind = OptimizerKind::adamw;  // DeepSpeed's Adam decouples weight decay unless adam_w_mode is false
    allowed = {"lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode", "amsgrad", "torch_adam"};
  } else if (t == "sgd") {
    p.kind = OptimizerKind::sgd;
    allowed = {"lr", "momentum", "dampening", "weight_decay", "nesterov"};
    if (!params.contains("lr") || params["lr"].is_null()) ZEROTH_THROW(ConfigError, "optimizer.params.lr is required for SGD");
  } else if (t == "lion") {
    p.kind = OptimizerKind::lion;
    p.beta2 = 0.999;
    allowed = {"lr", "betas", "weight_decay"};
  } else if (t == "lamb") {
    // FusedLamb's constructor (deepspeed/ops/lamb/fused_lamb.py, lines 39-51 at microsoft/DeepSpeed
    // 077e674): lr 1e-3, bias_correction true, betas (0.9, 0.999), eps 1e-8, eps_inside_sqrt false,
    // weight_decay 0, max_grad_norm 0, max_coeff 10, min_coeff 0.01, amsgrad false (an error
    // there too); the defaults of OptimizerParams.
    p.kind = OptimizerKind::lamb;
    allowed = {"lr",           "bias_correction", "betas",     "eps",       "eps_inside_sqrt",
               "weight_decay", "max_grad_norm",   "max_coeff", "min_coeff", "amsgrad"};
  } else {
    static constexpr std::string_view kTypes[] = {"Adam",        "AdamW",      "SGD",     "Lion",   "Lamb",    "OneBitAdam",
                                                  "ZeroOneAdam", "OneBitLamb", "Adagrad", "MuAdam", "MuAdamW", "MuSGD"};
    static constexpr std::string_view kSupported[] = {"Adam", "AdamW", "SGD", "Lion", "Lamb"};
    const auto known = closest_match(type, kTypes);
    if (!known.empty() && lower(known) == t) {
      ZEROTH_THROW(ConfigError,
                   "optimizer.type \"{}\" is a DeepSpeed optimizer zeroth does not support; use Adam, AdamW, SGD, Lion or Lamb", type);
    }
    ZEROTH_THROW(ConfigError, "optimizer.type \"{}\" is unknown{}; zeroth supports Adam, AdamW, SGD, Lion and Lamb", type,
                 did_you_mean(type, kSupported));
  }
  for (const auto& [key, value] : params.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      ZEROTH_THROW(ConfigError, "optimizer.params.{} is not a parameter of {}{}", key, type, did_you_mean(key, allowed));
    }
  }
  const ConfigSection s(params, "optimizer.params", allowed);
  p.lr = number(s, "lr", p.lr);
  if (params.contains("betas")) {
    const auto& b = params["betas"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number()) {
      ZEROTH_THROW(ConfigError, "optimizer.params.betas must be two numbers like [0.9, 0.999], got {}", b.dump());
    }
    p.beta1 = b[0].get<double>();
    p.beta2 = b[1].get<double>();
  }
  p.eps = number(s, "eps", p.eps);
  p.weight_decay = number(s, "weight_decay", p.weight_decay);
  p.bias_correction = s.flag("bias_correction", p.bias_correction);
  if (t == "adam" && !s.flag("adam_w_mode", true)) p.kind = OptimizerKind::adam;
  if (t == "adamw" && !s.flag("adam_w_mode", true)) {
    ZEROTH_THROW(ConfigError, "optimizer.params.adam_w_mode = false contradicts type AdamW; use type Adam for L2 weight decay");
  }
  if (s.flag("amsgrad", false)) {
    ZEROTH_THROW(ConfigError, "optimizer.params.amsgrad = true is not supported by zeroth");
  }
  p.eps_inside_sqrt = s.flag("eps_inside_sqrt", p.eps_inside_sqrt);
  p.max_coeff = number(s, "max_coeff", p.max_coeff);
  p.min_coeff = number(s, "min_coeff", p.min_coeff);
  // FusedLamb's own clipping rescales each tensor's gradient by a norm its caller passes to step();
  // zeroth clips by the global norm of all gradients (gradient_clipping) before every optimizer.
  if (const double max_grad_norm = number(s, "max_grad_norm", 0.0); max_grad_norm != 0.0) {
    ZEROTH_THROW(ConfigError,
                 "optimizer.params.max_grad_norm = {} is not supported by zeroth; set it to 0 and use the top-level "
                 "\"gradient_clipping\" (clipping by the global gradient norm)",
                 max_grad_norm);
  }
  s.flag("torch_adam", false);  // picks an implementation in DeepSpeed; zeroth has one
  p.momentum = number(s, "momentum", p.momentum);
  p.dampening = number(s, "dampening", p.dampening);
  p.nesterov = s.flag("nesterov", p.nesterov);
  p.validate();
  return p;
}

}  // namespace zeroth
