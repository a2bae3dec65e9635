// Loads a PyTorch reference's initial weights ("init.<block>.<param>") into the engine's master
// weights, block by block, so a run starts where the reference did.
#pragma once

#include <string>  // std::string
#include <vector>  // std::vector

#include "core/safetensors.h"  // SafeTensors
#include "engine/engine.h"     // Engine
#include <nlohmann/json.hpp>   // nlohmann::json

namespace zeroth::testing {

inline void set_master_from_reference(Engine& engine, const SafeTensors& reference) {
  for (size_t b = 0; b < engine.plan().blocks.size(); ++b) {
    const auto& spec = engine.block_spec(static_cast<int>(b));
    std::vector<float> values;
    for (const auto& p : spec.params) {
      const auto v = reference.at("init." + spec.name + "." + p.name).as_f32();
      values.insert(values.end(), v.begin(), v.end());
    }
    engine.set_master_values(static_cast<int>(b), values);
  }
}

// The reference's AdamW ({"lr", "betas", "eps", "weight_decay"} in its metadata).
inline OptimizerParams adamw_from_reference(const nlohmann::json& opt) {
  OptimizerParams o;
  o.kind = OptimizerKind::adamw;
  o.lr = opt["lr"];
  o.beta1 = opt["betas"][0];
  o.beta2 = opt["betas"][1];
  o.eps = opt["eps"];
  o.weight_decay = opt["weight_decay"];
  return o;
}

}  // namespace zeroth::testing
