// Lamb over several tensors against the float64 definition: each tensor's own trust ratio, the
// clamps at max_coeff and min_coeff reached, the ratio 1 of a tensor whose weights or update are
// zero; weight decay on and off, with and without bias correction; every SIMD level the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/kernels.h"
#include "optim/optimizer.h"
#include "tests/optim/lamb_reference.h"

namespace zeroth {
namespace {

struct TensorCase {
  std::string name;
  size_t n;
  float w_amp, g_amp;  // weights uniform in [-w_amp, w_amp], gradients in [-g_amp, g_amp]
};

// Several chunks and a vector tail; weights 100x larger than the updates (clamped at max_coeff);
// 1e-4 of them (clamped at min_coeff); no gradient (u = weight_decay * w, or 0); zero weights
// (||w|| = 0 on the first step).
const std::vector<TensorCase> kTensors = {{"ordinary", 2 * 16384 + 37, 1.0f, 0.05f},
                                          {"large", 1000, 100.0f, 0.05f},
                                          {"tiny", 999, 1e-4f, 0.05f},
                                          {"no_grad", 17, 1.0f, 0.0f},
                                          {"zero_weights", 300, 0.0f, 0.05f}};
constexpr int kSteps = 10;

std::vector<float> uniform(size_t n, uint64_t seed, float amp) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-amp, amp);
  std::vector<float> v(n);
  for (auto& x : v) x = amp == 0.0f ? 0.0f : d(rng);
  return v;
}

struct LambCase {
  std::string name;
  OptimizerParams params;
};
void PrintTo(const LambCase& c, std::ostream* os) { *os << c.name; }

std::vector<LambCase> lamb_cases() {
  std::vector<LambCase> c;
  OptimizerParams p;
  p.kind = OptimizerKind::lamb, p.lr = 1e-2, p.weight_decay = 0.01;
  c.push_back({"WeightDecay", p});
  p.weight_decay = 0.0;
  c.push_back({"NoWeightDecay", p});
  p.bias_correction = false, p.eps_inside_sqrt = true, p.beta1 = 0.8, p.beta2 = 0.99, p.eps = 1e-6, p.weight_decay = 0.01;
  c.push_back({"NoBiasCorrectionEpsInsideSqrt", p});
  return c;
}

struct State {
  std::vector<std::vector<float>> p, m, v;
};

// kSteps steps of every tensor, each a step of its own (one tensor each), at `level`.
State run(const OptimizerParams& o, cpu::SimdLevel level) {
  State s;
  for (size_t k = 0; k < kTensors.size(); ++k) {
    const auto& t = kTensors[k];
    s.p.push_back(uniform(t.n, 10 + k, t.w_amp));
    s.m.emplace_back(t.n, 0.0f);
    s.v.emplace_back(t.n, 0.0f);
  }
  for (int step = 1; step <= kSteps; ++step) {
    for (size_t k = 0; k < kTensors.size(); ++k) {
      const auto g = uniform(kTensors[k].n, 1000 * step + k, kTensors[k].g_amp);
      OptimizerStep st{s.p[k].data(), g.data(), DType::f32, {s.m[k].data(), s.v[k].data()}};
      st.count = kTensors[k].n;
      st.step = step;
      st.lr = o.lr * (1.0 - 0.03 * step);
      st.grad_scale = 0.5f;
      EXPECT_FALSE(cpu_optimizer_step(o, st, level).skipped);
    }
  }
  return s;
}

class Lamb : public ::testing::TestWithParam<LambCase> {};

// Each weight within 64 roundings per step of the float64 definition, relative to what can carry
// rounding: the weight itself and every step's movement lr * ratio * (|u| + 1) (u's rounding
// follows m / sqrt(v), which is O(1) even where m cancels to ~0). The trust ratio is summed in f32
// lanes of 1024 terms, whose error (~1e-7 relative for these positive terms) stays inside that.
TEST_P(Lamb, TensorsMatchTheFloat64DefinitionWithTheirOwnTrustRatios) {
  const auto& o = GetParam().params;
  const auto got = run(o, cpu::active_simd_level());
  for (size_t k = 0; k < kTensors.size(); ++k) {
    const auto& t = kTensors[k];
    const auto init = uniform(t.n, 10 + k, t.w_amp);
    std::vector<double> p(init.begin(), init.end()), m(t.n, 0.0), v(t.n, 0.0), moved(t.n, 0.0);
    std::vector<double> ratios, unclamped;
    for (int step = 1; step <= kSteps; ++step) {
      const auto g32 = uniform(t.n, 1000 * step + k, t.g_amp);
      std::vector<double> g(g32.begin(), g32.end());
      for (auto& x : g) x *= 0.5;
      const double lr = static_cast<float>(o.lr * (1.0 - 0.03 * step));
      const auto r = testing::lamb_reference_step(o, lr, step, p, g, m, v);
      for (size_t i = 0; i < t.n; ++i) moved[i] += lr * r.ratio * (std::fabs(r.update[i]) + 1.0);
      ratios.push_back(r.ratio);
      unclamped.push_back(r.unclamped);
    }
    double worst = 0;
    for (size_t i = 0; i < t.n; ++i) {
      const double err = std::fabs(got.p[k][i] - p[i]) / (std::fabs(p[i]) + moved[i]);
      worst = std::max(worst, err);
      ASSERT_LE(err, 64 * kSteps * 0x1p-24) << GetParam().name << " " << t.name << "[" << i << "]: " << got.p[k][i] << " vs " << p[i];
    }
    std::printf("[%s %s] trust ratio step 1 %.4g, step %d %.4g (unclamped %.4g); max error %.2e\n", GetParam().name.c_str(),
                t.name.c_str(), ratios.front(), kSteps, ratios.back(), unclamped.back(), worst);
    // The cases this tensor stands for happen.
    for (int s = 0; s < kSteps; ++s) {
      const bool max_hit = unclamped[s] > o.max_coeff && ratios[s] == o.max_coeff;
      const bool min_hit = unclamped[s] < o.min_coeff && ratios[s] == o.min_coeff;
      const bool inside = ratios[s] > o.min_coeff && ratios[s] < o.max_coeff;
      EXPECT_TRUE(t.name != "large" || max_hit) << t.name << " step " << s + 1;
      EXPECT_TRUE(t.name != "tiny" || min_hit) << t.name << " step " << s + 1;
      EXPECT_TRUE(t.name != "ordinary" || inside) << t.name << " step " << s + 1;
    }
    EXPECT_TRUE(t.name != "zero_weights" || ratios.front() == 1.0) << "||w|| = 0: ratio 1";
    if (t.name == "no_grad" && o.weight_decay == 0) {
      // u = 0: ratio 1 and nothing moves.
      EXPECT_EQ(got.p[k], uniform(t.n, 10 + k, t.w_amp));
      EXPECT_EQ(ratios.back(), 1.0);
    }
  }
}

TEST_P(Lamb, EveryLevelIsBitIdenticalToScalar) {
  const auto ref = run(GetParam().params, cpu::SimdLevel::scalar);
  for (auto level : cpu::supported_simd_levels()) {
    const auto got = run(GetParam().params, level);
    EXPECT_TRUE(got.p == ref.p && got.m == ref.m && got.v == ref.v) << cpu::simd_level_name(level);
  }
}

INSTANTIATE_TEST_SUITE_P(All, Lamb, ::testing::ValuesIn(lamb_cases()), [](const auto& info) { return info.param.name; });

// A tensor split into pieces (as ranks and sub-groups split it): the first pass over each piece
// adds into one pair of sums, the second applies the whole tensor's ratio; the result is the whole
// tensor's step up to the order of the sums (a few f32 roundings of each weight and step), and far
// from what a ratio per piece gives.
TEST(LambPieces, PiecesSharingOnePairOfSumsStepLikeTheWholeTensor) {
  OptimizerParams o;
  o.kind = OptimizerKind::lamb, o.lr = 1e-2, o.weight_decay = 0.01;
  const size_t n = 40000;
  // Weights grow along the tensor, so each piece alone would have another ratio.
  auto p0 = uniform(n, 3, 1.0f);
  for (size_t i = 0; i < n; ++i) p0[i] *= 0.1f + 2.0f * i / n;
  const auto g = uniform(n, 4, 0.05f);
  auto whole = p0, pieces = p0, alone = p0;
  std::vector<float> m1(n, 0), v1(n, 0), m2(n, 0), v2(n, 0), m3(n, 0), v3(n, 0);
  auto step_of = [&](std::vector<float>& p, std::vector<float>& m, std::vector<float>& v, size_t lo, size_t hi) {
    OptimizerStep s{p.data() + lo, g.data() + lo, DType::f32, {m.data() + lo, v.data() + lo}};
    s.count = hi - lo;
    s.lr = o.lr;
    return s;
  };
  cpu_optimizer_step(o, step_of(whole, m1, v1, 0, n));
  const size_t cuts[] = {0, 7001, 20000, 33333, n};
  float norms[2] = {0, 0};
  for (int k = 0; k < 4; ++k) cpu_lamb_norms(o, step_of(pieces, m2, v2, cuts[k], cuts[k + 1]), norms);
  for (int k = 0; k < 4; ++k) cpu_lamb_apply(o, step_of(pieces, m2, v2, cuts[k], cuts[k + 1]), norms);
  for (int k = 0; k < 4; ++k) cpu_optimizer_step(o, step_of(alone, m3, v3, cuts[k], cuts[k + 1]));
  double err = 0, apart = 0;
  for (size_t i = 0; i < n; ++i) {
    // Relative to the weight and the step's size (lr, times a ratio of ~0.6 and |u| <= ~1).
    const double scale = std::fabs(whole[i]) + o.lr;
    err = std::max(err, std::fabs(static_cast<double>(pieces[i]) - whole[i]) / scale);
    apart = std::max(apart, std::fabs(static_cast<double>(alone[i]) - whole[i]) / scale);
  }
  EXPECT_EQ(m2, m1);
  EXPECT_EQ(v2, v1);
  EXPECT_LE(err, 1e-6);
  EXPECT_GE(apart, 1e-3) << "per-piece ratios should differ from the tensor's";
  std::printf("pieces vs whole: %.2e; ratios per piece vs whole: %.2e\n", err, apart);
}

}  // namespace
}  // namespace zeroth
