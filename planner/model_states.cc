// The ZeRO paper's model-state arithmetic and DeepSpeed's estimator, step for step.
#include "planner/model_states.h"

#include <algorithm>  // std::max

#include "core/error.h"  // ZEROTH_CHECK

namespace zeroth {

ModelStates zero_model_states(uint64_t params, int stage, uint64_t gpus, OffloadDevice optimizer, OffloadDevice parameters,
                              uint64_t largest_layer) {
  ZEROTH_CHECK(stage >= 0 && stage <= 3 && gpus > 0, "zero_model_states: stage {} on {} GPUs", stage, gpus);
  ZEROTH_CHECK(stage > 0 || optimizer == OffloadDevice::none, "the optimizer is offloaded at stages 1-3 only");
  ZEROTH_CHECK(stage == 3 || parameters == OffloadDevice::none, "the parameters are offloaded at stage 3 only");
  const double p = static_cast<double>(params), n = static_cast<double>(gpus);
  // Bytes per parameter of each kind, and the share of them a GPU holds.
  const double param_share = stage == 3 ? p / n : p, grad_share = stage >= 2 ? p / n : p, opt_share = stage >= 1 ? p / n : p;
  double device = 2 * param_share + 2 * grad_share + 12 * opt_share, host = 0, nvme = 0;
  if (optimizer != OffloadDevice::none) {
    device -= 12 * opt_share;
    (optimizer == OffloadDevice::cpu ? host : nvme) += 16 * opt_share;  // master, moments, fp32 gradient shard
  }
  if (parameters != OffloadDevice::none) {
    device -= 2 * param_share;
    device += 4 * static_cast<double>(largest_layer);
    (parameters == OffloadDevice::cpu ? host : nvme) += 2 * param_share;
  }
  return {static_cast<uint64_t>(device + 0.5), static_cast<uint64_t>(host + 0.5), static_cast<uint64_t>(nvme + 0.5)};
}

std::vector<DeepSpeedEstimate> deepspeed_estimates(uint64_t params, uint64_t largest_layer, int gpus_per_node, int nodes) {
  // Python's arithmetic, step for step: integer products stay exact, a float enters with the first
  // float factor, int() truncates.
  const double p = static_cast<double>(params), factor = 1.5, gpus_factor = 1.0 / nodes;
  const uint64_t total_gpus = static_cast<uint64_t>(gpus_per_node) * static_cast<uint64_t>(nodes);
  const uint64_t largest_memory = 4 * largest_layer;
  auto trunc = [](double v) { return static_cast<uint64_t>(v); };
  std::vector<DeepSpeedEstimate> out;
  // ZeRO-2
  out.push_back({2, true, false, -1, trunc(p * static_cast<double>(std::max<uint64_t>(4 * total_gpus, 16)) * factor), 2 * params});
  out.push_back({2, false, false, -1, trunc(static_cast<double>(params * 4 * static_cast<uint64_t>(gpus_per_node)) * factor),
                 2 * params + trunc(static_cast<double>(18 * params) / static_cast<double>(total_gpus))});
  // ZeRO-3
  const double four_per_node = static_cast<double>(4 * gpus_per_node);
  for (int init : {1, 0}) {
    const double m = init ? 18 * gpus_factor : std::max(four_per_node, 18 * gpus_factor);
    out.push_back({3, true, true, init, trunc(p * m * factor), largest_memory});
  }
  for (int init : {1, 0}) {
    const double m = init ? 16 * gpus_factor : std::max(four_per_node, 16 * gpus_factor);
    out.push_back({3, true, false, init, trunc(p * m * factor),
                   largest_memory + trunc(static_cast<double>(2 * params) / static_cast<double>(total_gpus))});
  }
  for (int init : {1, 0}) {
    const double cpu = init ? static_cast<double>(largest_layer * 4 * static_cast<uint64_t>(gpus_per_node)) * factor
                            : static_cast<double>(params * 4 * static_cast<uint64_t>(gpus_per_node)) * factor;
    out.push_back({3, false, false, init, trunc(cpu),
                   largest_memory + trunc(static_cast<double>(18 * params) / static_cast<double>(total_gpus))});
  }
  return out;
}

}  // namespace zeroth
