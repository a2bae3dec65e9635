// Model-state memory from a parameter count alone, with no model and no plan: the ZeRO paper's
// formulas and DeepSpeed's own estimator. `zeroth estimate --params` prints them; the GPT layouts
// of planner/gpt_layout.h build on them.
#pragma once

#include <cstdint>  // uint64_t
#include <vector>   // std::vector

#include "engine/config/config.h"  // OffloadDevice

namespace zeroth {

// The ZeRO paper's model-state memory per GPU (Rajbhandari et al. 2020, section 3 and Table 1):
// mixed-precision Adam holds 2 bytes of parameters, 2 of gradients and K = 12 of optimizer state
// (fp32 master weights, momentum, variance) per parameter; stage 1 partitions the optimizer state
// over the N data-parallel GPUs, stage 2 the gradients too, stage 3 the parameters too:
//   stage 0: 16 P   stage 1: 4 P + 12 P / N   stage 2: 2 P + 14 P / N   stage 3: 16 P / N
// Offloading the optimizer (ZeRO-Offload / -Infinity) moves its 12 P / N and an fp32 copy of the
// gradient shard (4 P / N) to host memory (cpu) or to NVMe (nvme); offloading the parameters
// (stage 3) moves their 2 P / N too, the device keeping the largest layer's parameters and
// gradients at work (4 bytes per parameter of it). The parameter-count mode of `zeroth estimate`.
struct ModelStates {
  uint64_t device = 0, host = 0, nvme = 0;  // bytes per GPU
};
ModelStates zero_model_states(uint64_t params, int stage, uint64_t gpus, OffloadDevice optimizer = OffloadDevice::none,
                              OffloadDevice parameters = OffloadDevice::none, uint64_t largest_layer = 0);

// DeepSpeed's own model-state estimator, as its code computes it (deepspeed/runtime/zero/
// stage_1_and_2.py estimate_zero2_model_states_mem_needs and stage3.py
// estimate_zero3_model_states_mem_needs, additional_buffer_factor 1.5), for users who compare:
// its rows in its order (ZeRO-2: optimizer offload cpu, none; ZeRO-3: params and optimizer on
// cpu, optimizer only on cpu, neither; each with and without zero.Init). Since DeepSpeed 0.14.3
// its ZeRO-2 without offload is 2P + 18P/N on the GPU, where its documentation still says
// 4P + 16P/N.
struct DeepSpeedEstimate {
  int stage = 2;
  bool offload_optimizer = false, offload_param = false;
  int zero_init = -1;  // stage 3: 1 or 0; stage 2: -1 (not a choice)
  uint64_t cpu_bytes = 0, gpu_bytes = 0;
};
std::vector<DeepSpeedEstimate> deepspeed_estimates(uint64_t params, uint64_t largest_layer, int gpus_per_node, int nodes);

}  // namespace zeroth
