// LR schedules against their closed forms at chosen steps, and the loss scaler through a
// scripted sequence of overflowing and clean steps.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/error_types.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"

namespace zeroth {
namespace {

LrSchedule parse(const char* text, double base_lr = 1e-3) {
  return LrSchedule::from_deepspeed(nlohmann::json::parse(text), base_lr);
}

TEST(Schedules, WarmupLrLogAndLinearMatchTheirFormulas) {
  auto log = parse(R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.01, "warmup_num_steps": 100}})");
  EXPECT_DOUBLE_EQ(log.lr(0), 0.0);  // log(1) = 0: warmup start
  EXPECT_DOUBLE_EQ(log.lr(9), 0.01 * std::log(10.0) / std::log(100.0));
  EXPECT_DOUBLE_EQ(log.lr(99), 0.01 * std::log(100.0) / std::log(100.0));  // warmup end
  EXPECT_DOUBLE_EQ(log.lr(100), 0.01);
  EXPECT_DOUBLE_EQ(log.lr(5000), 0.01);
  auto lin = parse(R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.003, "warmup_num_steps": 10, "warmup_type": "linear"}})");
  EXPECT_DOUBLE_EQ(lin.lr(0), 0.001);
  EXPECT_DOUBLE_EQ(lin.lr(5), 0.001 + 0.002 * 0.5);
  EXPECT_DOUBLE_EQ(lin.lr(10), 0.003);
}

TEST(Schedules, WarmupDecayLrDecaysLinearlyToZeroAtTheEnd) {
  auto s = parse(R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 1000, "warmup_max_lr": 0.02, "warmup_num_steps": 100, "warmup_type": "linear"}})");
  EXPECT_DOUBLE_EQ(s.lr(50), 0.01);
  EXPECT_DOUBLE_EQ(s.lr(100), 0.02);                      // warmup end: decay starts at full lr
  EXPECT_DOUBLE_EQ(s.lr(550), 0.02 * 450.0 / 900.0);      // halfway
  EXPECT_DOUBLE_EQ(s.lr(1000), 0.0);                      // decay end
  EXPECT_DOUBLE_EQ(s.lr(1200), 0.0);                      // never negative
}

TEST(Schedules, WarmupCosineLrReachesItsFloor) {
  auto s = parse(R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 1100, "warmup_num_steps": 100, "cos_min_ratio": 0.1, "warmup_type": "linear", "warmup_min_ratio": 0.2}})",
                 3e-4);
  EXPECT_DOUBLE_EQ(s.lr(0), 3e-4 * 0.2);  // warmup start at warmup_min_ratio
  EXPECT_DOUBLE_EQ(s.lr(50), 3e-4 * (0.2 + 0.5 * 0.8));
  EXPECT_DOUBLE_EQ(s.lr(100), 3e-4 * (0.1 + 0.9 * (1 + std::cos(M_PI * 1 / 1000.0)) / 2));
  EXPECT_DOUBLE_EQ(s.lr(599), 3e-4 * (0.1 + 0.9 * 0.5));  // cosine midpoint
  EXPECT_NEAR(s.lr(1099), 3e-4 * 0.1, 1e-18);              // the floor
}

TEST(Schedules, OneCycleRisesFallsAndDecays) {
  auto s = parse(R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.011, "cycle_first_step_size": 100, "cycle_second_step_size": 300, "decay_step_size": 50, "decay_lr_rate": 0.1, "cycle_momentum": false}})");
  EXPECT_DOUBLE_EQ(s.lr(0), 0.001);
  EXPECT_DOUBLE_EQ(s.lr(50), 0.006);
  EXPECT_DOUBLE_EQ(s.lr(100), 0.011);                      // peak
  EXPECT_DOUBLE_EQ(s.lr(250), 0.001 + 0.01 * 0.5);         // halfway down
  EXPECT_NEAR(s.lr(400), 0.001, 1e-15);                    // cycle end
  EXPECT_DOUBLE_EQ(s.lr(500), 0.001 * (1 + 0.1 * 2.0));    // decay phase: 100 steps / 50
}

TEST(Schedules, ConstantAndResumeAreFunctionsOfTheStep) {
  LrSchedule c;
  c.base_lr = 0.5;
  EXPECT_DOUBLE_EQ(c.lr(0), 0.5);
  EXPECT_DOUBLE_EQ(c.lr(123456), 0.5);
  auto s = parse(R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}})");
  std::vector<double> run;
  for (int i = 0; i < 100; ++i) run.push_back(s.lr(i));
  auto resumed = parse(R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}})");
  for (int i = 40; i < 100; ++i) EXPECT_EQ(resumed.lr(i), run[i]);
}

TEST(Schedules, MistakesAreNamed) {
  auto error = [](const char* text) {
    try {
      parse(text);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(R"({"type": "WarmupLr"})").find("did you mean 'WarmupLR'"), std::string::npos);
  EXPECT_NE(error(R"({"type": "WarmupLR", "params": {"warmup_max": 1}})").find("did you mean 'warmup_max_lr'"), std::string::npos);
  EXPECT_NE(error(R"({"type": "WarmupDecayLR", "params": {}})").find("total_num_steps is required"), std::string::npos);
  EXPECT_NE(error(R"({"type": "WarmupLR", "params": {"warmup_type": "cubic"}})").find("warmup_type"), std::string::npos);
  EXPECT_NE(error(R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_momentum": true}})").find("cycle_momentum"), std::string::npos);
}

TEST(LossScaler, ScriptedOverflowsMoveTheScaleAsDeepSpeedDoes) {
  LossScalerConfig c;
  c.initial_scale_power = 4;  // 16
  c.loss_scale_window = 3;
  c.hysteresis = 2;
  LossScaler s(c);
  EXPECT_EQ(s.scale(), 16.0);
  // overflow #1 is absorbed by hysteresis; #2 halves the scale.
  s.update(true);
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_EQ(s.hysteresis_left(), 1);
  s.update(true);
  EXPECT_EQ(s.scale(), 8.0);
  // Clean steps: the window counts from the last overflow (iteration 1); at iteration 4 it is 3.
  s.update(false);  // it 2
  s.update(false);  // it 3
  EXPECT_EQ(s.scale(), 8.0);
  s.update(false);  // it 4: (4 - 1) % 3 == 0 -> double, hysteresis restored
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_EQ(s.hysteresis_left(), 2);
  // An isolated overflow is absorbed again, and the clean count restarts from it.
  s.update(true);   // it 5
  EXPECT_EQ(s.scale(), 16.0);
  s.update(false);  // 6
  s.update(false);  // 7
  EXPECT_EQ(s.scale(), 16.0);
  s.update(false);  // 8: (8 - 5) % 3 == 0
  EXPECT_EQ(s.scale(), 32.0);
}

TEST(LossScaler, TheMinimumIsAnErrorAndStaticScalesNeverMove) {
  LossScalerConfig c;
  c.initial_scale_power = 1;
  c.hysteresis = 1;
  c.min_loss_scale = 1;
  LossScaler s(c);
  s.update(true);
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_THROW(s.update(true), Error);
  LossScalerConfig fixed;
  fixed.loss_scale = 128;
  LossScaler f(fixed);
  for (int i = 0; i < 5000; ++i) f.update(i % 7 == 0);
  EXPECT_EQ(f.scale(), 128.0);
  const auto parsed = LossScalerConfig::from_deepspeed(nlohmann::json::parse(R"({"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "hysteresis": 3})"));
  EXPECT_EQ(LossScaler(parsed).scale(), 4096.0);
  EXPECT_THROW(LossScalerConfig::from_deepspeed(nlohmann::json::parse(R"({"loss_scale_windw": 10})")), ConfigError);
}

TEST(LossScaler, OverflowCheckFindsInfInAnyTensor) {
  auto device = make_device("cpu");
  auto& stream = device->default_stream();
  std::vector<float> a(1000, 1.0f), b(77, 2.0f);
  const TensorView views[] = {{a.data(), a.size(), DType::f32}, {b.data(), b.size(), DType::f32}};
  EXPECT_FALSE(LossScaler::has_overflow(*device, stream, views));
  b[76] = INFINITY;
  EXPECT_TRUE(LossScaler::has_overflow(*device, stream, views));
}

}  // namespace
}  // namespace zeroth
