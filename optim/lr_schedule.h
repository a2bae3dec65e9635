// Learning-rate schedules with DeepSpeed's names, parameters and formulas, as pure functions of
// the iteration, so a resumed run continues the same curve.
//
// `lr(iteration)` is DeepSpeed's get_lr() with last_batch_iteration = iteration; the engine uses
// lr(t - 1) for optimizer step t (1-based), i.e. the first step sees the schedule's start.
#pragma once

#include <cstdint>  // int64_t
#include <string>   // std::string

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

namespace zeroth {

enum class ScheduleKind : uint8_t { constant, warmup, warmup_decay, warmup_cosine, one_cycle };
enum class WarmupType : uint8_t { log, linear };

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::constant;
  double base_lr = 1e-3;  // the optimizer's lr: constant's value, WarmupCosineLR's reference

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
  int64_t cycle_first_stair_count = 0, cycle_second_stair_count = -1;

  double lr(int64_t iteration) const;
  std::string describe() const;

  // DeepSpeed's `scheduler` section ({"type": "WarmupLR", "params": {...}}); base_lr is the
  // optimizer's lr. Unknown types and keys are ConfigErrors with suggestions.
  static LrSchedule from_deepspeed(const nlohmann::json& section, double base_lr);
};

}  // namespace zeroth
