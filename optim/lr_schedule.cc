// The schedules' formulas, as in deepspeed/runtime/lr_schedules.py.
#include "optim/lr_schedule.h"

#include <algorithm>  // std::max
#include <cmath>      // std::log, std::cos, std::floor

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/strings.h"

namespace zeroth {

namespace {

double warmup_gamma(WarmupType type, int64_t iteration, int64_t steps) {
  const int64_t n = std::max<int64_t>(2, steps);  // DeepSpeed clamps warmup_num_steps to >= 2
  if (type == WarmupType::log) return std::log(static_cast<double>(iteration + 1)) / std::log(static_cast<double>(n));
  return static_cast<double>(iteration) / static_cast<double>(n);
}

}  // namespace

double LrSchedule::lr(int64_t iteration) const {
  if (iteration < 0) iteration = 0;
  const int64_t warm = std::max<int64_t>(2, warmup_num_steps);
  switch (kind) {
    case ScheduleKind::constant: return base_lr;
    case ScheduleKind::warmup: {
      const double gamma = iteration < warm ? warmup_gamma(warmup_type, iteration, warm) : 1.0;
      return warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma;
    }
    case ScheduleKind::warmup_decay: {
      const double gamma = iteration < warm ? warmup_gamma(warmup_type, iteration, warm)
                                            : std::max(0.0, static_cast<double>(total_num_steps - iteration) /
                                                                std::max(1.0, static_cast<double>(total_num_steps - warm)));
      return warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma;
    }
    case ScheduleKind::warmup_cosine: {
      if (iteration < warm) {
        const double ratio = warmup_gamma(warmup_type, iteration, warm);
        return base_lr * (warmup_min_ratio + ratio * (1.0 - warmup_min_ratio));
      }
      const double done = static_cast<double>(iteration - warm + 1), span = static_cast<double>(total_num_steps - warm);
      const double cosine = (1.0 + std::cos(M_PI * done / span)) / 2.0;
      return base_lr * std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * cosine);
    }
    case ScheduleKind::one_cycle: {
      const double first = static_cast<double>(cycle_first_step_size);
      const double second = cycle_second_step_size < 0 ? first : static_cast<double>(cycle_second_step_size);
      const double total = first + second, ratio = first / total;
      const double it = static_cast<double>(iteration);
      if (it <= total) {
        const double cycle = std::floor(1.0 + it / total);
        const double x = 1.0 + it / total - cycle;
        const double scale = x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
        return cycle_min_lr + (cycle_max_lr - cycle_min_lr) * scale;
      }
      if (decay_step_size <= 0) return cycle_min_lr;
      const double interval = (it - total) / static_cast<double>(decay_step_size);
      return cycle_min_lr * (1.0 + decay_lr_rate * interval);
    }
  }
  return base_lr;
}

std::string LrSchedule::describe() const {
  switch (kind) {
    case ScheduleKind::constant: return fmt::format("constant lr {}", base_lr);
    case ScheduleKind::warmup:
      return fmt::format("WarmupLR {} -> {} over {} steps ({})", warmup_min_lr, warmup_max_lr, warmup_num_steps,
                         warmup_type == WarmupType::log ? "log" : "linear");
    case ScheduleKind::warmup_decay:
      return fmt::format("WarmupDecayLR {} -> {} over {} steps, linear decay to 0 at step {}", warmup_min_lr, warmup_max_lr,
                         warmup_num_steps, total_num_steps);
    case ScheduleKind::warmup_cosine:
      return fmt::format("WarmupCosineLR peak {} after {} steps, cosine to {} x peak at step {}", base_lr, warmup_num_steps,
                         cos_min_ratio, total_num_steps);
    case ScheduleKind::one_cycle:
      return fmt::format("OneCycle {} <-> {} over {} steps", cycle_min_lr, cycle_max_lr,
                         cycle_first_step_size + (cycle_second_step_size < 0 ? cycle_first_step_size : cycle_second_step_size));
  }
  return "invalid";
}

LrSchedule LrSchedule::from_deepspeed(const nlohmann::json& section, double base_lr) {
  LrSchedule s;
  s.base_lr = base_lr;
  if (!section.is_object() || !section.contains("type") || !section["type"].is_string()) {
    ZEROTH_THROW(ConfigError, "scheduler must be an object with a \"type\" (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle)");
  }
  for (const auto& [key, value] : section.items()) {
    static constexpr std::string_view kKeys[] = {"type", "params"};
    if (key != "type" && key != "params") ZEROTH_THROW(ConfigError, "scheduler.{} is not a known key{}", key, did_you_mean(key, kKeys));
  }
  const std::string type = section["type"];
  const nlohmann::json params = section.value("params", nlohmann::json::object());
  std::vector<std::string_view> allowed;
  if (type == "WarmupLR") {
    s.kind = ScheduleKind::warmup;
    allowed = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"};
  } else if (type == "WarmupDecayLR") {
    s.kind = ScheduleKind::warmup_decay;
    allowed = {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"};
  } else if (type == "WarmupCosineLR") {
    s.kind = ScheduleKind::warmup_cosine;
    allowed = {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type", "last_batch_iteration"};
  } else if (type == "OneCycle") {
    s.kind = ScheduleKind::one_cycle;
    allowed = {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size", "cycle_second_step_size",
               "cycle_first_stair_count", "cycle_second_stair_count", "decay_step_size", "cycle_momentum", "cycle_min_mom",
               "cycle_max_mom", "decay_mom_rate", "last_batch_iteration"};
  } else {
    static constexpr std::string_view kTypes[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"};
    if (type == "LRRangeTest") ZEROTH_THROW(ConfigError, "scheduler.type LRRangeTest is a DeepSpeed scheduler zeroth does not support");
    ZEROTH_THROW(ConfigError, "scheduler.type \"{}\" is unknown{}; zeroth supports WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle",
                 type, did_you_mean(type, kTypes));
  }
  for (const auto& [key, value] : params.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      ZEROTH_THROW(ConfigError, "scheduler.params.{} is not a parameter of {}{}", key, type, did_you_mean(key, allowed));
    }
  }
  auto num = [&](const char* key, auto& out) {
    if (!params.contains(key)) return;
    const auto& v = params[key];
    if (!v.is_number()) ZEROTH_THROW(ConfigError, "scheduler.params.{} must be a number, got {}", key, v.dump());
    out = v.get<std::remove_reference_t<decltype(out)>>();
  };
  num("warmup_min_lr", s.warmup_min_lr);
  num("warmup_max_lr", s.warmup_max_lr);
  num("warmup_num_steps", s.warmup_num_steps);
  num("total_num_steps", s.total_num_steps);
  num("warmup_min_ratio", s.warmup_min_ratio);
  num("cos_min_ratio", s.cos_min_ratio);
  num("cycle_min_lr", s.cycle_min_lr);
  num("cycle_max_lr", s.cycle_max_lr);
  num("decay_lr_rate", s.decay_lr_rate);
  num("cycle_first_step_size", s.cycle_first_step_size);
  num("cycle_second_step_size", s.cycle_second_step_size);
  num("decay_step_size", s.decay_step_size);
  num("cycle_first_stair_count", s.cycle_first_stair_count);
  num("cycle_second_stair_count", s.cycle_second_stair_count);
  if (params.contains("warmup_type")) {
    const auto& v = params["warmup_type"];
    if (v == "log") s.warmup_type = WarmupType::log;
    else if (v == "linear") s.warmup_type = WarmupType::linear;
    else ZEROTH_THROW(ConfigError, "scheduler.params.warmup_type must be \"log\" or \"linear\", got {}", v.dump());
  }
  if (s.cycle_first_stair_count != 0 || (s.cycle_second_stair_count > 0)) {
    ZEROTH_THROW(ConfigError, "scheduler.params.cycle_*_stair_count (staircase OneCycle) is not supported by zeroth; remove it");
  }
  if (params.contains("cycle_momentum") && params["cycle_momentum"] == true) {
    ZEROTH_THROW(ConfigError, "scheduler.params.cycle_momentum = true (cycling Adam's beta1) is not supported by zeroth; set it to false");
  }
  if ((s.kind == ScheduleKind::warmup_decay || s.kind == ScheduleKind::warmup_cosine) && s.total_num_steps <= 0) {
    ZEROTH_THROW(ConfigError, "scheduler.params.total_num_steps is required by {} and must be > 0", type);
  }
  if (s.kind == ScheduleKind::warmup_cosine && s.total_num_steps <= std::max<int64_t>(2, s.warmup_num_steps)) {
    ZEROTH_THROW(ConfigError, "scheduler.params.total_num_steps ({}) must exceed warmup_num_steps ({})", s.total_num_steps,
                 s.warmup_num_steps);
  }
  if (s.kind == ScheduleKind::one_cycle && !params.contains("cycle_max_lr")) {
    ZEROTH_THROW(ConfigError, "scheduler.params.cycle_min_lr and cycle_max_lr are required by OneCycle");
  }
  if (s.warmup_num_steps < 0) ZEROTH_THROW(ConfigError, "scheduler.params.warmup_num_steps must be >= 0");
  return s;
}

}  // namespace zeroth
