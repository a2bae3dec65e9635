// Loads a PyTorch reference's initial weights ("init.<block>.<param>") into the engine's master
// weights, block by block, so a run starts where the reference did.
#pragma once

#include <string>  // std::string
#include <vector>  // std::vector

#include "core/safetensors.h"  // SafeTensors
#include "engine/engine.h"     // Engine

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

}  // namespace zeroth::testing
