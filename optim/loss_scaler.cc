// DeepSpeed's DynamicLossScaler, step for step.
#include "optim/loss_scaler.h"

#include <algorithm>    // std::max
#include <cmath>        // std::ldexp
#include <limits>       // std::numeric_limits
#include <type_traits>  // std::remove_reference_t

#include <nlohmann/json.hpp>

#include "core/config_section.h"
#include "core/error.h"

namespace zeroth {

LossScalerConfig LossScalerConfig::from_deepspeed(const nlohmann::json& fp16) {
  LossScalerConfig c;
  const ConfigSection s(fp16, "fp16", kDeepSpeedKeys);
  // Numbers of any value here; the checks below say which each takes, as DeepSpeed's do.
  auto num = [&](const char* key, auto& out) {
    constexpr double kAny = std::numeric_limits<double>::max();
    out = static_cast<std::remove_reference_t<decltype(out)>>(s.number(key, static_cast<double>(out), -kAny, kAny, "a number"));
  };
  num("loss_scale", c.loss_scale);
  num("initial_scale_power", c.initial_scale_power);
  num("loss_scale_window", c.loss_scale_window);
  num("hysteresis", c.hysteresis);
  num("min_loss_scale", c.min_loss_scale);
  c.consecutive_hysteresis = s.flag("consecutive_hysteresis", c.consecutive_hysteresis);
  if (s.flag("fp16_master_weights_and_grads", false)) {
    ZEROTH_THROW(ConfigError, "fp16.fp16_master_weights_and_grads is not supported: zeroth keeps fp32 master weights");
  }
  if (c.loss_scale < 0) ZEROTH_THROW(ConfigError, "fp16.loss_scale must be 0 (dynamic) or positive, got {}", c.loss_scale);
  if (c.initial_scale_power < 0 || c.initial_scale_power > 64) {
    ZEROTH_THROW(ConfigError, "fp16.initial_scale_power must be in [0, 64], got {}", c.initial_scale_power);
  }
  if (c.loss_scale_window < 1) ZEROTH_THROW(ConfigError, "fp16.loss_scale_window must be >= 1, got {}", c.loss_scale_window);
  if (c.hysteresis < 1) ZEROTH_THROW(ConfigError, "fp16.hysteresis must be >= 1, got {}", c.hysteresis);
  if (!(c.min_loss_scale > 0)) ZEROTH_THROW(ConfigError, "fp16.min_loss_scale must be > 0, got {}", c.min_loss_scale);
  return c;
}

LossScaler::LossScaler(LossScalerConfig config)
    : config_(config),
      scale_(config.loss_scale > 0 ? config.loss_scale : std::ldexp(1.0, config.initial_scale_power)),
      hysteresis_(config.hysteresis) {}

void LossScaler::update(bool overflow) {
  if (!dynamic()) {
    ++iteration_;
    return;
  }
  if (overflow) {
    if (config_.hysteresis == 1 || hysteresis_ == 1) {
      if (scale_ == config_.min_loss_scale && config_.raise_error_at_min_scale) {
        ZEROTH_THROW(NumericError,
                     "f16 gradients overflow at step {} although the loss scale is already at its minimum (fp16.min_loss_scale "
                     "= {}) and the hysteresis is spent: the model diverged or f16 cannot hold its values; lower the learning "
                     "rate, or train in bf16",
                     iteration_ + 1, config_.min_loss_scale);
      }
      scale_ = std::max(scale_ / config_.scale_factor, config_.min_loss_scale);
    } else {
      --hysteresis_;
    }
    last_overflow_ = iteration_;
  } else {
    if (config_.consecutive_hysteresis) hysteresis_ = config_.hysteresis;
    // DynamicLossScaler.update_scale (DeepSpeed >= 0.17.1): the scale grows on the
    // (window + 1)-th clean step after the last overflow (or the start), and only then is the
    // hysteresis refilled unless consecutive_hysteresis refills it on every clean step.
    const int64_t stable_interval = iteration_ - last_overflow_ - 1;
    if (stable_interval > 0 && stable_interval % config_.loss_scale_window == 0) {
      if (!config_.consecutive_hysteresis) hysteresis_ = config_.hysteresis;
      scale_ *= config_.scale_factor;
    }
  }
  ++iteration_;
}

bool LossScaler::has_overflow(Device& device, Stream& stream, std::span<const TensorView> tensors) {
  Buffer flag = device.allocate(sizeof(int32_t), MemTag::buffers);
  const int32_t zero = 0;
  device.copy(stream, flag.data(), &zero, sizeof zero);
  for (const auto& t : tensors) device.flag_nonfinite(stream, t, flag.as<int32_t>());
  int32_t result = 0;
  device.copy(stream, &result, flag.data(), sizeof result);
  stream.synchronize();
  return result != 0;
}

}  // namespace zeroth
