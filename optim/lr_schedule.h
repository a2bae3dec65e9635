// Learning-rate schedules with DeepSpeed's names, parameters, formulas and stepping, as pure
// functions of the iteration, so a resumed run continues the same curve.
//
// `lr(i)` is DeepSpeed's get_lr() with last_batch_iteration = i; i = -1 is the value the
// scheduler's constructor sets. DeepSpeed builds the scheduler before the first step and calls
// scheduler.step() after every applied optimizer step (not after one skipped for an fp16
// overflow), so optimizer step k, counted over applied steps, uses lr(k - 2): `at_step(k)`.
#pragma once

#include <cstdint>  // int64_t
#include <string>   // std::string

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

namespace zeroth {

enum class ScheduleKind : uint8_t { constant, warmup, warmup_decay, warmup_cosine, one_cycle, lr_range_test };
enum class WarmupType : uint8_t { log, linear };

// What the schedule sets for one optimizer step: the lr, and Adam's betas when OneCycle cycles
// momentum (DeepSpeed writes (beta1, 0.99) into the optimizer's param groups).
struct ScheduledValues {
  double lr = 0;
  bool sets_betas = false;
  double beta1 = 0, beta2 = 0;
};

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::constant;
  double base_lr = 1e-3;  // the optimizer's lr: constant's value, WarmupCosineLR's reference
  // DeepSpeed's last_batch_iteration: -1 starts the schedule; a later value resumes it there, and
  // then the first step keeps the optimizer's own lr (the constructors set nothing).
  int64_t last_batch_iteration = -1;

  // WarmupLR / WarmupDecayLR
  double warmup_min_lr = 0.0, warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::log;
  int64_t total_num_steps = 0;  // WarmupDecayLR, WarmupCosineLR
  // WarmupCosineLR
  double warmup_min_ratio = 0.0, cos_min_ratio = 1e-4;
  // OneCycle
  double cycle_min_lr = 0.0, cycle_max_lr = 0.0, decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000, cycle_second_step_size = -1;  // -1: same as the first
  int64_t decay_step_size = 0;
  int64_t cycle_first_stair_count = 0, cycle_second_stair_count = -1;  // -1: same as the first
  bool cycle_momentum = false;                                         // set by from_deepspeed (DeepSpeed's default is true)
  double cycle_min_mom = 0.8, cycle_max_mom = 0.9, decay_mom_rate = 0.0;
  // LRRangeTest
  double lr_range_test_min_lr = 1e-3, lr_range_test_step_rate = 1.0;
  int64_t lr_range_test_step_size = 2000;
  bool lr_range_test_staircase = false;

  double lr(int64_t iteration) const;
  // OneCycle's (beta1, beta2) at an iteration, when it cycles momentum.
  ScheduledValues values(int64_t iteration) const;
  // What optimizer step `step` (1-based, counted over applied steps) runs with.
  ScheduledValues at_step(int64_t step) const;
  std::string describe() const;

  // DeepSpeed's `scheduler` section ({"type": "WarmupLR", "params": {...}}); base_lr is the
  // optimizer's lr; optimizer_has_betas says whether OneCycle may cycle momentum (DeepSpeed turns
  // cycle_momentum off, with a warning, for optimizers without betas). Unknown types and keys
  // are ConfigErrors with suggestions.
  static LrSchedule from_deepspeed(const nlohmann::json& section, double base_lr, bool optimizer_has_betas = true);
};

}  // namespace zeroth
