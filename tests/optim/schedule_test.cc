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

LrSchedule parse(const char* text, double base_lr = 1e-3) { return LrSchedule::from_deepspeed(nlohmann::json::parse(text), base_lr); }

// Each expected value below is DeepSpeed's deepspeed/runtime/lr_schedules.py (commit 22779f2)
// evaluated by hand, the method it follows named in the comment. `at_step(k)` is what optimizer
// step k uses: DeepSpeed's engine builds the scheduler before step 1 (last_batch_iteration = -1,
// the constructor's update_lr) and calls scheduler.step() after each applied step
// (engine.py, _take_model_step), so step k sees iteration k - 2.
std::vector<double> lrs_of_steps(const LrSchedule& s, int steps) {
  std::vector<double> out;
  for (int k = 1; k <= steps; ++k) out.push_back(s.at_step(k).lr);
  return out;
}

void expect_sequence(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_DOUBLE_EQ(got[i], want[i]) << "optimizer step " << i + 1;
}

TEST(Schedules, WarmupLrStepsAsDeepSpeedsEngine) {
  // warmup_max_lr absent: WarmupLR.__init__ takes the optimizer's lr (0.01). Log warmup over W = 4:
  // _get_gamma = log(i + 1) / log(4) reaches 1 at i = W - 1 = 3.
  auto log = parse(R"({"type": "WarmupLR", "params": {"warmup_num_steps": 4}})", 0.01);
  const double l4 = std::log(4.0);
  expect_sequence(lrs_of_steps(log, 7), {0.0,                        // step 1: constructor, min_lr
                                         0.0,                        // iteration 0: log(1) = 0
                                         0.01 * std::log(2.0) / l4,  // iteration 1
                                         0.01 * std::log(3.0) / l4,  // iteration 2
                                         0.01,                       // iteration 3 = W - 1: the max
                                         0.01, 0.01});
  // warmup_num_steps 1 is raised to 2 (max(2, warmup_num_steps)); linear: i / W.
  auto lin = parse(
      R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.003, "warmup_num_steps": 1, "warmup_type": "linear"}})");
  expect_sequence(lrs_of_steps(lin, 5), {0.001, 0.001, 0.002, 0.003, 0.003});
  // An unknown warmup_type falls back to log (a warning, not an error).
  auto cubic = parse(R"({"type": "WarmupLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 4, "warmup_type": "cubic"}})");
  expect_sequence(lrs_of_steps(cubic, 7), lrs_of_steps(log, 7));
}

TEST(Schedules, WarmupDecayLrDecaysToItsMinimumAndStays) {
  // WarmupDecayLR._get_gamma: after warmup max(0, (T - i) / max(1, T - W)); lr = min + delta * gamma.
  auto s = parse(
      R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 6, "warmup_min_lr": 0.0002, "warmup_max_lr": 0.001, "warmup_num_steps": 2, "warmup_type": "linear"}})");
  const double lo = 0.0002, d = 0.0008;
  expect_sequence(lrs_of_steps(s, 12), {lo, lo, lo + d * 0.5, lo + d, lo + d * 0.75, lo + d * 0.5, lo + d * 0.25, lo, lo, lo, lo, lo});
  // WarmupDecayLR.__init__'s own warmup_max_lr default is 0.001, not the optimizer's lr.
  auto dflt = parse(R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_num_steps": 2, "warmup_type": "linear"}})",
                    0.5);
  EXPECT_DOUBLE_EQ(dflt.lr(2), 0.001);
}

TEST(Schedules, WarmupCosineLrStartsAtZeroAndClampsAtItsFloor) {
  // WarmupCosineLR.get_lr: 0.0 before the first step(), even with warmup_min_ratio > 0; then
  // get_lr_ratio: warmup_min_ratio + r * (1 - warmup_min_ratio), and after warmup
  // cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi * min(1, (i - W + 1) / (T - W)))) / 2.
  auto s = parse(
      R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 7, "warmup_num_steps": 3, "warmup_min_ratio": 0.2, "cos_min_ratio": 0.1, "warmup_type": "linear"}})",
      0.1);
  auto cosine = [](double progress) { return 0.1 * (0.1 + 0.9 * (1 + std::cos(M_PI * progress)) / 2); };
  expect_sequence(lrs_of_steps(s, 12), {0.0,        // constructor
                                        0.1 * 0.2,  // iteration 0
                                        0.1 * (0.2 + 0.8 / 3), 0.1 * (0.2 + 0.8 * 2 / 3), cosine(0.25), cosine(0.5), cosine(0.75),
                                        cosine(1.0),                                           // iterations 3-6
                                        cosine(1.0), cosine(1.0), cosine(1.0), cosine(1.0)});  // clamped past T
  EXPECT_NEAR(s.lr(6), 0.1 * 0.1, 1e-17);
}

TEST(Schedules, OneCycleCyclesLrAndMomentumThenDecays) {
  // OneCycle, total 4 + 6 = 10, step_ratio 0.4; _get_scale_factor uses batch b = i + 1.
  auto s = parse(
      R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.011, "cycle_first_step_size": 4, "cycle_second_step_size": 6, "decay_step_size": 5, "decay_lr_rate": 0.5, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95, "decay_mom_rate": 0.01}})");
  struct Row {
    int64_t iteration;
    double lr, beta1;
  };
  const Row rows[] = {
      {-1, 0.001, 0.85},                                          // _initialize_lr / _initialize_momentum: the minima
      {0, 0.001 + 0.01 * 0.25, 0.95 - 0.1 * 0.25},                // x = 0.1: scale 0.1 / 0.4
      {2, 0.001 + 0.01 * 0.75, 0.95 - 0.1 * 0.75},                // x = 0.3
      {3, 0.011, 0.85},                                           // x = 0.4: the peak, momentum at its minimum
      {4, 0.001 + 0.01 * (0.5 / 0.6), 0.95 - 0.1 * (0.5 / 0.6)},  // x = 0.5: (x - 1) / (0.4 - 1)
      {8, 0.001 + 0.01 * (0.1 / 0.6), 0.95 - 0.1 * (0.1 / 0.6)},
      {9, 0.001, 0.95},                                                  // b = 10: the cycle's end
      {10, 0.001 / (1 + 0.5 * 1 / 5.0), 0.95 * (1 + 0.01 * 1 / 5.0)},    // _get_decay_lr: min / (1 + rate * 1/5)
      {19, 0.001 / (1 + 0.5 * 10 / 5.0), 0.95 * (1 + 0.01 * 10 / 5.0)},  // a fall, not a growth
  };
  for (const auto& r : rows) {
    const auto v = s.values(r.iteration);
    EXPECT_DOUBLE_EQ(v.lr, r.lr) << "iteration " << r.iteration;
    ASSERT_TRUE(v.sets_betas) << "cycle_momentum defaults to true";
    EXPECT_DOUBLE_EQ(v.beta1, r.beta1) << "iteration " << r.iteration;
    EXPECT_EQ(v.beta2, 0.99) << "DeepSpeed sets beta2 to 0.99";
  }
  EXPECT_DOUBLE_EQ(s.at_step(1).beta1, 0.85);
  EXPECT_DOUBLE_EQ(s.at_step(5).lr, 0.011);  // step 5 sees iteration 3
  // Without momentum cycling (or with an optimizer without betas) the optimizer keeps its betas.
  EXPECT_FALSE(parse(R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_momentum": false}})")
                   .at_step(3)
                   .sets_betas);
  EXPECT_FALSE(
      LrSchedule::from_deepspeed(nlohmann::json::parse(R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1}})"),
                                 0.1, false)
          .at_step(3)
          .sets_betas);
}

TEST(Schedules, OneCycleStaircaseHoldsEachStair) {
  // cycle_first_stair_count 2 (the second half takes the same count): _get_scale_factor's
  // floor(position) / stairs, the position from the batch's offset inside the cycle of 8.
  auto s = parse(
      R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.0, "cycle_max_lr": 0.01, "cycle_first_step_size": 4, "cycle_first_stair_count": 2, "cycle_momentum": false}})");
  const double want[] = {0.0, 0.005, 0.005, 0.01, 0.005, 0.005, 0.0, 0.0};  // iterations 0..7 (b = 1..8)
  for (int i = 0; i < 8; ++i) EXPECT_DOUBLE_EQ(s.lr(i), want[i]) << "iteration " << i;
}

TEST(Schedules, LrRangeTestGrowsContinuouslyOrInStairs) {
  // LRRangeTest.get_lr: min_lr * (1 + rate * (i + 1) / step_size), floored in staircase mode.
  auto cont = parse(
      R"({"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.01, "lr_range_test_step_size": 3, "lr_range_test_step_rate": 0.5}})");
  expect_sequence(lrs_of_steps(cont, 4), {0.01, 0.01 * (1 + 0.5 / 3), 0.01 * (1 + 0.5 * 2 / 3), 0.01 * 1.5});
  auto stairs = parse(
      R"({"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.01, "lr_range_test_step_size": 3, "lr_range_test_step_rate": 0.5, "lr_range_test_staircase": true}})");
  expect_sequence(lrs_of_steps(stairs, 8), {0.01, 0.01, 0.01, 0.015, 0.015, 0.015, 0.02, 0.02});
}

TEST(Schedules, ConstantAndResumeAreFunctionsOfTheStep) {
  LrSchedule c;
  c.base_lr = 0.5;
  EXPECT_DOUBLE_EQ(c.at_step(1).lr, 0.5);
  EXPECT_DOUBLE_EQ(c.at_step(123456).lr, 0.5);
  // last_batch_iteration 9: the constructors set nothing, so step 1 keeps the optimizer's lr, and
  // step k runs iteration 9 + k - 1.
  auto resumed = parse(
      R"({"type": "WarmupLR", "params": {"warmup_max_lr": 0.02, "warmup_num_steps": 20, "warmup_type": "linear", "last_batch_iteration": 9}})",
      0.05);
  expect_sequence(lrs_of_steps(resumed, 3), {0.05, 0.02 * 10 / 20, 0.02 * 11 / 20});
}

// The start box's description counts optimizer steps; its claims hold against at_step.
TEST(Schedules, DescriptionsCountOptimizerSteps) {
  auto log = parse(R"({"type": "WarmupDecayLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 4, "total_num_steps": 10}})");
  EXPECT_EQ(log.describe(), "WarmupDecayLR 0 at steps 1-2, log warmup to 0.01 at step 5, linear decay to 0 at step 12, then held");
  EXPECT_LT(log.at_step(4).lr, 0.01);
  EXPECT_DOUBLE_EQ(log.at_step(5).lr, 0.01);
  EXPECT_GT(log.at_step(11).lr, 0.0);
  EXPECT_EQ(log.at_step(12).lr, 0.0);
  auto cosine = parse(R"({"type": "WarmupCosineLR", "params": {"warmup_num_steps": 3, "total_num_steps": 7, "cos_min_ratio": 0.1}})",
                      0.1);
  EXPECT_NE(cosine.describe().find("cosine to 0.1 x 0.1 at step 8"), std::string::npos) << cosine.describe();
  EXPECT_GT(cosine.at_step(7).lr, cosine.at_step(8).lr);
  EXPECT_DOUBLE_EQ(cosine.at_step(8).lr, cosine.at_step(20).lr);
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
  EXPECT_NE(error(R"({"type": "WarmupLR", "params": {"warmup_num_steps": -1}})").find("warmup_num_steps must be an integer >= 0"),
            std::string::npos);
  EXPECT_EQ(parse(R"({"type": "WarmupLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 0, "warmup_type": "linear"}})").lr(1),
            0.005);
  EXPECT_NE(error(R"({"type": "OneCycle", "params": {"cycle_min_lr": 0}})").find("cycle_max_lr are required"), std::string::npos);
  EXPECT_NE(error(R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_max_mom": 1.5}})").find("beta1"),
            std::string::npos);
  EXPECT_NE(error(R"({"type": "LRRangeTest", "params": {"lr_range_test_step_size": 0}})").find("lr_range_test_step_size"),
            std::string::npos);
}

TEST(LossScaler, ScriptedOverflowsMoveTheScaleAsDeepSpeedDoes) {
  // DynamicLossScaler.update_scale (deepspeed/runtime/fp16/loss_scaler.py): the scale grows when
  // (cur_iter - last_overflow_iter - 1) is a positive multiple of the window, i.e. on the
  // (window + 1)-th clean step; an overflow absorbed by hysteresis restarts that count.
  LossScalerConfig c;
  c.initial_scale_power = 4;  // 16
  c.loss_scale_window = 3;
  c.hysteresis = 2;
  LossScaler s(c);
  struct Row {
    bool overflow;
    double scale;
    int hysteresis;
  };
  const Row script[] = {
      {true, 16, 1},   // it 0: absorbed by hysteresis; last overflow = 0
      {false, 16, 1},  // it 1: stable interval 0; the hysteresis is not refilled by a clean step
      {false, 16, 1},  // it 2: 1
      {false, 16, 1},  // it 3: 2
      {false, 32, 2},  // it 4: 3, the 4th clean step: doubles, and only now the hysteresis refills
      {true, 32, 1},   // it 5: absorbed
      {true, 16, 1},   // it 6: hysteresis spent: halves
      {false, 16, 1}, {false, 16, 1}, {false, 16, 1}, {false, 32, 2},  // it 10: stable interval 3
  };
  int it = 0;
  for (const auto& r : script) {
    s.update(r.overflow);
    EXPECT_EQ(s.scale(), r.scale) << "iteration " << it;
    EXPECT_EQ(s.hysteresis_left(), r.hysteresis) << "iteration " << it;
    ++it;
  }
  // From the start (last overflow -1) the first growth is at iteration `window`.
  LossScaler fresh(c);
  for (int i = 0; i < 3; ++i) fresh.update(false);
  EXPECT_EQ(fresh.scale(), 16.0);
  fresh.update(false);
  EXPECT_EQ(fresh.scale(), 32.0);
  // consecutive_hysteresis refills on every clean step, so isolated overflows never halve.
  c.consecutive_hysteresis = true;
  LossScaler consecutive(c);
  for (bool overflow : {true, false, true, false, true}) consecutive.update(overflow);
  EXPECT_EQ(consecutive.scale(), 16.0);
  EXPECT_EQ(consecutive.hysteresis_left(), 1);
}

TEST(LossScaler, TheMinimumIsAnErrorAndStaticScalesNeverMove) {
  LossScalerConfig c;
  c.initial_scale_power = 1;
  c.hysteresis = 1;
  c.min_loss_scale = 1;
  LossScaler s(c);
  s.update(true);
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_THROW(s.update(true), NumericError);
  // With hysteresis, the overflows it absorbs at the minimum come first.
  c.hysteresis = 2;
  LossScaler h(c);
  h.update(true);  // absorbed at 2
  h.update(true);  // halves to 1
  EXPECT_EQ(h.scale(), 1.0);
  // The hysteresis spent on the way down is not refilled: the next overflow ends the run.
  try {
    h.update(true);
    ADD_FAILURE() << "an overflow at the minimum scale with the hysteresis spent must end the run";
  } catch (const NumericError& e) {
    EXPECT_NE(std::string(e.what()).find("min_loss_scale"), std::string::npos) << e.what();
  }
  LossScalerConfig fixed;
  fixed.loss_scale = 128;
  LossScaler f(fixed);
  for (int i = 0; i < 5000; ++i) f.update(i % 7 == 0);
  EXPECT_EQ(f.scale(), 128.0);
  const auto parsed = LossScalerConfig::from_deepspeed(
      nlohmann::json::parse(R"({"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "hysteresis": 3})"));
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
