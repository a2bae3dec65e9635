// One estimate of a rank's memory: the plan's bytes per tier and tag, the model's activations
// and scratch, and a stated allowance for small allocations outside both. The engine's budget
// check (which refuses a run before anything is allocated), the config box, `--dry-run` (and
// `zeroth estimate`) all read it.
#pragma once

#include <cstddef>      // size_t
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "engine/plan/plan.h"       // Plan
#include "engine/plan/placement.h"  // TierBytes
#include "models/block_api.h"       // ModelFootprint

namespace zeroth {

// Scalars, flags and allocator bookkeeping that neither the plan nor the model counts (the loss
// and stop flag of the loop, the gradient norm): stated, not measured per run.
inline constexpr size_t kEstimateAllowance = 64 * 1024;

struct MemoryNeed {
  TierBytes bytes{};                      // plan + model, per tier and tag
  size_t allowance = kEstimateAllowance;  // on the device tier
  // Pageable host memory outside the engine's tiers that initialization, a checkpoint's save or
  // load take: the largest of the initial values' chunk and bounce buffers (Executor::write_block),
  // the weights file's gathered block with the rank's slice of it (fp32), the checkpoint
  // writer's largest owned range of one state plus what its staging buffers hold of the file (and
  // the file's snapshot when saves are asynchronous), and, for a run that resumes, the load's
  // largest block run (values and moments) with the engine's copies of its values and the staging;
  // state in swap files adds the bounce buffer it goes through.
  size_t save_host = 0;
  // Pageable host memory the run around the engine holds on this rank: its copy of the tokens, its
  // loaders' window order, its threads' stacks and allocator arenas (train's run_host_bytes; the
  // engine alone leaves it 0).
  size_t run_host = 0;
  std::string activation_note;
  size_t total(Tier tier) const;          // with the allowance on the device tier
  std::string describe(Tier tier) const;  // "params 7.77 MiB, grads ..., allowance 64.00 KiB"
};

// The plan's bytes, the model's, and (tag other) the device buffers of gathering one block's fp32
// master values, which a run does at its end to save its weights. `snapshot_checkpoints`: saves
// are asynchronous (run.checkpoint_async), each copying the rank's file to the host first.
// `loads_checkpoint`: the run starts by loading one (run.resume).
MemoryNeed estimate(const Plan& plan, const ModelFootprint& model = {}, bool snapshot_checkpoints = false,
                    bool loads_checkpoint = false);

// Throws OutOfMemory, naming every part and what to change, when the need on `tier` exceeds
// `budget` (0: unlimited) less `in_use`. `budget_name` says where the budget comes from
// ("run.device_memory").
void check_fits(const MemoryNeed& need, const Plan& plan, Tier tier, size_t budget, size_t in_use, std::string_view budget_name);

}  // namespace zeroth
