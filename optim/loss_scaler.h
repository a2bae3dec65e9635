// Loss scaling for f16 training, with DeepSpeed's semantics: `fp16.loss_scale` 0 means dynamic,
// starting at 2^initial_scale_power; an overflow halves the scale once `hysteresis` overflows
// have been absorbed, and the (loss_scale_window + 1)-th clean step after the last overflow
// doubles it (DeepSpeed >= 0.17.1).
#pragma once

#include <cstdint>      // int64_t
#include <span>         // std::span
#include <string_view>  // std::string_view

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

#include "core/device.h"  // Device, Stream, TensorView

namespace zeroth {

struct LossScalerConfig {
  double loss_scale = 0.0;  // 0: dynamic; > 0: this static scale
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
  double scale_factor = 2.0;
  bool raise_error_at_min_scale = true;

  // The keys of DeepSpeed's `fp16` section this parser reads ("enabled" is the caller's).
  static constexpr std::string_view kDeepSpeedKeys[] = {"enabled",
                                                        "loss_scale",
                                                        "initial_scale_power",
                                                        "loss_scale_window",
                                                        "hysteresis",
                                                        "consecutive_hysteresis",
                                                        "min_loss_scale",
                                                        "fp16_master_weights_and_grads"};
  // DeepSpeed's `fp16` section (its "enabled" is read by the caller).
  static LossScalerConfig from_deepspeed(const nlohmann::json& fp16);
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerConfig config = {});

  double scale() const { return scale_; }
  bool dynamic() const { return config_.loss_scale == 0.0; }
  // Records one step's outcome: an overflowing step is skipped by the caller, and the scale
  // moves as DeepSpeed's DynamicLossScaler moves it. Throws Error when the scale would have to
  // drop below the minimum (and raise_error_at_min_scale).
  void update(bool overflow);
  int64_t iteration() const { return iteration_; }
  int64_t last_overflow_iteration() const { return last_overflow_; }
  int hysteresis_left() const { return hysteresis_; }

  // What a checkpoint keeps, so a resumed run scales as the uninterrupted one would.
  struct State {
    double scale = 1;
    int64_t iteration = 0, last_overflow = -1;
    int hysteresis = 0;
  };
  State state() const { return {scale_, iteration_, last_overflow_, hysteresis_}; }
  void restore(const State& s) {
    scale_ = s.scale, iteration_ = s.iteration, last_overflow_ = s.last_overflow, hysteresis_ = s.hysteresis;
  }

  // True when any tensor holds Inf or NaN (all on `device`, checked on `stream`, synchronizing).
  static bool has_overflow(Device& device, Stream& stream, std::span<const TensorView> tensors);

 private:
  LossScalerConfig config_;
  double scale_;
  int64_t iteration_ = 0;
  int64_t last_overflow_ = -1;
  int hysteresis_;
};

}  // namespace zeroth
