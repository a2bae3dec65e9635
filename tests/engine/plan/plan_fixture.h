// The blocks and stage-3 config the plan tests start from.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/plan/plan.h"

namespace zeroth::plan_fixture {

inline std::vector<BlockSpec> three_blocks() {
  return {{"embed", {{"weight", {100, 8}, InitRule::normal(0.02)}}},
          {"layer", {{"w", {8, 8}, InitRule::normal(0.1)}, {"b", {8}, InitRule::zeros(), ParamRole::bias}}},
          {"norm", {{"g", {8}, InitRule::constant(1.0), ParamRole::norm}}}};
}

inline EngineConfig stage3(uint64_t prefetch, uint64_t reuse) {
  EngineConfig c;
  c.zero.stage = 3;
  c.zero.stage3_prefetch_bucket_size = prefetch;
  c.zero.stage3_max_reuse_distance = reuse;
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.overlap_comm = true;  // DeepSpeed's default for stage 3
  c.alignment = 8;
  return c;
}

}  // namespace zeroth::plan_fixture
