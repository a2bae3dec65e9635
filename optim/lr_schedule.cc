// The schedules' formulas, as in DeepSpeed's deepspeed/runtime/lr_schedules.py (the class and
// method each branch follows is named next to it), including its rounding: the log warmup
// multiplies by a precomputed 1 / log(W), as DeepSpeed's inverse_log_warm_up does.
#include "optim/lr_schedule.h"

#include <algorithm>  // std::max, std::min, std::find
#include <cmath>      // std::log, std::cos, std::floor, std::fmod
#include <limits>     // std::numeric_limits

#include <fmt/format.h>  // fmt::format

#include <nlohmann/json.hpp>

#include "core/config_section.h"
#include "core/error.h"
#include "core/log.h"  // ZLOG_WARN
#include "core/strings.h"

namespace zeroth {

namespace {

constexpr double kCycleBeta2 = 0.99;  // OneCycle._initialize_momentum: (mom, 0.99) for every group

// WarmupLR._get_gamma / WarmupCosineLR.get_lr_ratio during warmup (iteration < W).
double warmup_fraction(WarmupType type, int64_t iteration, int64_t warm) {
  if (type == WarmupType::log) {
    const double inverse_log_warm_up = 1.0 / std::log(static_cast<double>(warm));
    return inverse_log_warm_up * std::log(static_cast<double>(iteration + 1));
  }
  return static_cast<double>(iteration) / static_cast<double>(warm);
}

}  // namespace

double LrSchedule::lr(int64_t iteration) const { return values(iteration).lr; }

// Long: one case per DeepSpeed scheduler, each following its Python get_lr line by line; one switch keeps them side by side.
ScheduledValues LrSchedule::values(int64_t iteration) const {
  ScheduledValues v;
  const int64_t warm = std::max<int64_t>(2, warmup_num_steps);  // WarmupLR.__init__: max(2, warmup_num_steps)
  switch (kind) {
    case ScheduleKind::constant: v.lr = base_lr; break;
    case ScheduleKind::warmup:
    case ScheduleKind::warmup_decay: {
      // WarmupLR.get_lr: before the first step() the minimum.
      double gamma = 0.0;
      if (iteration >= 0 && iteration < warm) {
        gamma = warmup_fraction(warmup_type, iteration, warm);
      } else if (iteration >= warm) {
        // WarmupLR._get_gamma holds the maximum; WarmupDecayLR._get_gamma decays linearly to
        // the minimum at total_num_steps and stays there.
        gamma = kind == ScheduleKind::warmup ? 1.0
                                             : std::max(0.0, static_cast<double>(total_num_steps - iteration) /
                                                                 std::max(1.0, static_cast<double>(total_num_steps - warm)));
      }
      v.lr = warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma;
      break;
    }
    case ScheduleKind::warmup_cosine: {
      // WarmupCosineLR.get_lr: 0 before the first step(), whatever warmup_min_ratio says.
      if (iteration < 0) break;
      double ratio;
      if (iteration < warm) {
        ratio = warmup_min_ratio + warmup_fraction(warmup_type, iteration, warm) * (1.0 - warmup_min_ratio);
      } else {
        // get_lr_ratio: the cosine's progress is clamped to 1, so past total_num_steps the
        // ratio stays at cos_min_ratio.
        const double real_last_step = static_cast<double>(iteration - warm + 1);
        const double real_total_steps = static_cast<double>(std::max<int64_t>(1, total_num_steps - warm));
        const double progress = std::min(1.0, real_last_step / real_total_steps);
        ratio = std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * ((1.0 + std::cos(M_PI * progress)) / 2.0));
      }
      v.lr = base_lr * ratio;
      break;
    }
    case ScheduleKind::one_cycle: {
      const double first = static_cast<double>(cycle_first_step_size);
      const double second = cycle_second_step_size < 0 ? first : static_cast<double>(cycle_second_step_size);
      const double total = first + second;
      if (iteration < 0) {
        // OneCycle._initialize_lr / _initialize_momentum: the minimum lr and the minimum momentum.
        v.lr = cycle_min_lr;
        if (cycle_momentum) v = {cycle_min_lr, true, cycle_min_mom, kCycleBeta2};
        break;
      }
      if (static_cast<double>(iteration) < total) {
        // OneCycle._get_scale_factor, with the batch index one past last_batch_iteration.
        const double batch = static_cast<double>(iteration + 1), ratio = first / total;
        const double cycle = std::floor(1.0 + batch / total), x = 1.0 + batch / total - cycle;
        double scale = x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
        const int64_t second_stairs = cycle_second_stair_count < 0 ? cycle_first_stair_count : cycle_second_stair_count;
        const int64_t stairs = x <= ratio ? cycle_first_stair_count : second_stairs;
        if (stairs > 0) {
          // Quantised from the integer offset inside the cycle, not from `scale`, as DeepSpeed does.
          const double in_cycle = std::fmod(batch, total);
          const double position = in_cycle <= first ? in_cycle * static_cast<double>(stairs) / first
                                                    : (total - in_cycle) * static_cast<double>(stairs) / second;
          scale = std::floor(position) / static_cast<double>(stairs);
        }
        v.lr = cycle_min_lr + (cycle_max_lr - cycle_min_lr) * scale;  // _get_cycle_lr
        if (cycle_momentum) v = {v.lr, true, cycle_max_mom - (cycle_max_mom - cycle_min_mom) * scale, kCycleBeta2};
        break;
      }
      // _get_decay_lr / _get_decay_mom: the lr falls as 1 / (1 + rate * interval); the momentum
      // grows by (1 + rate * interval). A zero decay_step_size or rate holds the end values.
      const double interval = decay_step_size == 0 ? 0.0
                                                   : static_cast<double>(iteration - static_cast<int64_t>(total) + 1) /
                                                         static_cast<double>(decay_step_size);
      v.lr = decay_lr_rate == 0.0 ? cycle_min_lr : cycle_min_lr / (1.0 + decay_lr_rate * interval);
      if (cycle_momentum)
        v = {v.lr, true, decay_mom_rate == 0.0 ? cycle_max_mom : cycle_max_mom * (1.0 + decay_mom_rate * interval), kCycleBeta2};
      break;
    }
    case ScheduleKind::lr_range_test: {
      // LRRangeTest.get_lr: min_lr * (1 + rate * interval), the interval floored when staircase.
      const double batch = static_cast<double>(std::max<int64_t>(iteration, -1) + 1);
      const double size = static_cast<double>(lr_range_test_step_size);
      const double interval = lr_range_test_staircase ? std::floor(batch / size) : batch / size;
      v.lr = lr_range_test_min_lr * (1.0 + lr_range_test_step_rate * interval);
      break;
    }
  }
  return v;
}

ScheduledValues LrSchedule::at_step(int64_t step) const {
  if (step <= 1) {
    if (last_batch_iteration == -1) return values(-1);
    return {base_lr, false, 0, 0};  // a resumed scheduler's constructor leaves the optimizer alone
  }
  return values(last_batch_iteration + step - 1);
}

// In optimizer steps as the run counts them: step k runs iteration k - 2 (see at_step).
std::string LrSchedule::describe() const {
  const int64_t warm = std::max<int64_t>(2, warmup_num_steps);
  const char* warmup = warmup_type == WarmupType::log ? "log" : "linear";
  // The log warmup reaches its top at iteration W - 1, the linear one at W.
  const int64_t top = (warmup_type == WarmupType::log ? warm - 1 : warm) + 2;
  std::string text;
  switch (kind) {
    case ScheduleKind::constant: text = fmt::format("constant lr {}", base_lr); break;
    case ScheduleKind::warmup:
      text = fmt::format("WarmupLR {} at steps 1-2, {} warmup to {} at step {}, then held", warmup_min_lr, warmup, warmup_max_lr, top);
      break;
    case ScheduleKind::warmup_decay:
      text = fmt::format("WarmupDecayLR {} at steps 1-2, {} warmup to {} at step {}, linear decay to {} at step {}, then held",
                         warmup_min_lr, warmup, warmup_max_lr, top, warmup_min_lr, total_num_steps + 2);
      break;
    case ScheduleKind::warmup_cosine:
      text = fmt::format("WarmupCosineLR 0 at step 1, {} warmup from {} x {} over {} steps, cosine to {} x {} at step {}, then held",
                         warmup, warmup_min_ratio, base_lr, warm, cos_min_ratio, base_lr,
                         total_num_steps > warm ? total_num_steps + 1 : warm + 2);
      break;
    case ScheduleKind::one_cycle: {
      const int64_t second = cycle_second_step_size < 0 ? cycle_first_step_size : cycle_second_step_size;
      const int64_t stairs2 = cycle_second_stair_count < 0 ? cycle_first_stair_count : cycle_second_stair_count;
      text = fmt::format("OneCycle {} at step 1, up to {} over {} steps{}, down over {}{}, then {}", cycle_min_lr, cycle_max_lr,
                         cycle_first_step_size,
                         cycle_first_stair_count > 0 ? fmt::format(" in {} stairs", cycle_first_stair_count) : "", second,
                         stairs2 > 0 ? fmt::format(" in {} stairs", stairs2) : "",
                         decay_step_size > 0 && decay_lr_rate != 0.0
                             ? fmt::format("lr / (1 + {} x steps past the cycle / {})", decay_lr_rate, decay_step_size)
                             : fmt::format("held at {}", cycle_min_lr));
      if (cycle_momentum)
        text += fmt::format("; beta1 cycles {} <-> {} against it and beta2 is 0.99 (cycle_momentum)", cycle_max_mom, cycle_min_mom);
      break;
    }
    case ScheduleKind::lr_range_test:
      text = fmt::format("LRRangeTest from {} x (1 + {} x {}steps / {})", lr_range_test_min_lr, lr_range_test_step_rate,
                         lr_range_test_staircase ? "floor of " : "", lr_range_test_step_size);
      break;
  }
  if (last_batch_iteration != -1) text += fmt::format(" (resumed at iteration {}: steps count from there)", last_batch_iteration);
  return text;
}

// Long: the scheduler section as DeepSpeed reads it: the type's allowed keys, each parameter read once, then the checks
// across parameters, which need them all read.
LrSchedule LrSchedule::from_deepspeed(const nlohmann::json& section, double base_lr, bool optimizer_has_betas) {
  LrSchedule s;
  s.base_lr = base_lr;
  static constexpr std::string_view kTypes[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"};
  if (!section.is_object() || !section.contains("type") || !section["type"].is_string()) {
    ZEROTH_THROW(ConfigError,
                 "scheduler must be an object with a \"type\" (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)");
  }
  for (const auto& [key, value] : section.items()) {
    static constexpr std::string_view kKeys[] = {"type", "params"};
    if (key != "type" && key != "params")
      ZEROTH_THROW(ConfigError, "scheduler.{} is not a known key{}", key, did_you_mean(key, kKeys));
  }
  const std::string type = section["type"];
  const nlohmann::json params = section.value("params", nlohmann::json::object());
  if (!params.is_object()) ZEROTH_THROW(ConfigError, "scheduler.params must be an object, got {}", params.dump());
  std::vector<std::string_view> allowed = {"last_batch_iteration"};
  auto allow = [&](std::initializer_list<std::string_view> keys) { allowed.insert(allowed.end(), keys); };
  if (type == "WarmupLR") {
    s.kind = ScheduleKind::warmup;
    allow({"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"});
    s.warmup_max_lr = base_lr;  // WarmupLR.__init__: warmup_max_lr None takes the optimizer's lr
  } else if (type == "WarmupDecayLR") {
    s.kind = ScheduleKind::warmup_decay;
    allow({"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"});
    s.warmup_max_lr = 0.001;  // WarmupDecayLR.__init__'s own default, passed on to WarmupLR
  } else if (type == "WarmupCosineLR") {
    s.kind = ScheduleKind::warmup_cosine;
    allow({"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type"});
  } else if (type == "OneCycle") {
    s.kind = ScheduleKind::one_cycle;
    allow({"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size", "cycle_second_step_size",
           "cycle_first_stair_count", "cycle_second_stair_count", "decay_step_size", "cycle_momentum", "cycle_min_mom",
           "cycle_max_mom", "decay_mom_rate"});
  } else if (type == "LRRangeTest") {
    s.kind = ScheduleKind::lr_range_test;
    allow({"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate", "lr_range_test_staircase"});
  } else {
    ZEROTH_THROW(ConfigError,
                 "scheduler.type \"{}\" is unknown{}; the DeepSpeed schedulers are WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle "
                 "and LRRangeTest",
                 type, did_you_mean(type, kTypes));
  }
  for (const auto& [key, value] : params.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      ZEROTH_THROW(ConfigError, "scheduler.params.{} is not a parameter of {}{}", key, type, did_you_mean(key, allowed));
    }
  }
  // JSON null stands for Python's None where DeepSpeed's default is None: the key's default.
  const ConfigSection in(params, "scheduler.params", allowed);
  auto real = [&](const char* key, double& out) {
    constexpr double kAny = std::numeric_limits<double>::max();
    out = in.number(key, out, -kAny, kAny, "a number");
  };
  auto integer = [&](const char* key, int64_t& out, int64_t min) {
    out = in.integer(key, out, min, std::numeric_limits<int64_t>::max(), fmt::format("an integer >= {}", min));
  };
  auto flag = [&](const char* key, bool& out) { out = in.flag(key, out); };
  integer("last_batch_iteration", s.last_batch_iteration, -1);
  real("warmup_min_lr", s.warmup_min_lr);
  real("warmup_max_lr", s.warmup_max_lr);
  // 0 warms up over DeepSpeed's minimum of 2, as DeepSpeed did before its newest releases began to
  // refuse it; Hugging Face writes 0 for "auto" when there is no warmup.
  integer("warmup_num_steps", s.warmup_num_steps, 0);
  integer("total_num_steps", s.total_num_steps, 1);
  real("warmup_min_ratio", s.warmup_min_ratio);
  real("cos_min_ratio", s.cos_min_ratio);
  real("cycle_min_lr", s.cycle_min_lr);
  real("cycle_max_lr", s.cycle_max_lr);
  real("decay_lr_rate", s.decay_lr_rate);
  integer("cycle_first_step_size", s.cycle_first_step_size, 1);
  integer("cycle_second_step_size", s.cycle_second_step_size, 1);
  integer("decay_step_size", s.decay_step_size, 0);
  integer("cycle_first_stair_count", s.cycle_first_stair_count, 0);
  integer("cycle_second_stair_count", s.cycle_second_stair_count, 0);
  s.cycle_momentum = s.kind == ScheduleKind::one_cycle;  // OneCycle.__init__: cycle_momentum=True
  flag("cycle_momentum", s.cycle_momentum);
  real("cycle_min_mom", s.cycle_min_mom);
  real("cycle_max_mom", s.cycle_max_mom);
  real("decay_mom_rate", s.decay_mom_rate);
  real("lr_range_test_min_lr", s.lr_range_test_min_lr);
  real("lr_range_test_step_rate", s.lr_range_test_step_rate);
  integer("lr_range_test_step_size", s.lr_range_test_step_size, 1);
  flag("lr_range_test_staircase", s.lr_range_test_staircase);
  if (params.contains("warmup_type")) {
    // Any other value falls back to log, with DeepSpeed's warning.
    const auto& v = params["warmup_type"];
    s.warmup_type = v == "linear" ? WarmupType::linear : WarmupType::log;
    if (v != "linear" && v != "log") {
      ZLOG_WARN("scheduler.params.warmup_type {} is not \"log\" or \"linear\"; the warmup is log, as DeepSpeed falls back to",
                v.dump());
    }
  }
  if ((s.kind == ScheduleKind::warmup_decay || s.kind == ScheduleKind::warmup_cosine) && !params.contains("total_num_steps")) {
    ZEROTH_THROW(ConfigError, "scheduler.params.total_num_steps is required by {}", type);
  }
  if ((s.kind == ScheduleKind::warmup_decay || s.kind == ScheduleKind::warmup_cosine) && s.total_num_steps < s.warmup_num_steps) {
    ZLOG_WARN("scheduler.params.total_num_steps {} is less than warmup_num_steps {}: {} holds its end value after the warmup",
              s.total_num_steps, s.warmup_num_steps, type);
  }
  if (s.kind == ScheduleKind::one_cycle && (!params.contains("cycle_min_lr") || !params.contains("cycle_max_lr"))) {
    ZEROTH_THROW(ConfigError, "scheduler.params.cycle_min_lr and cycle_max_lr are required by OneCycle");
  }
  if (s.cycle_momentum && !optimizer_has_betas) {
    ZLOG_WARN("scheduler OneCycle: cycle_momentum is off because the optimizer has no betas, as DeepSpeed does");
    s.cycle_momentum = false;
  }
  if (s.cycle_momentum && !(s.cycle_min_mom >= 0 && s.cycle_min_mom < 1 && s.cycle_max_mom >= 0 && s.cycle_max_mom < 1)) {
    ZEROTH_THROW(ConfigError, "scheduler.params.cycle_min_mom ({}) and cycle_max_mom ({}) become Adam's beta1 and must be in [0, 1)",
                 s.cycle_min_mom, s.cycle_max_mom);
  }
  return s;
}

}  // namespace zeroth
