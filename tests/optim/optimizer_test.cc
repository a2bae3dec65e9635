// The optimizers against float64 references over 20 steps (every gradient and copy-out dtype),
// every SIMD level bit-identical to scalar on odd sizes and unaligned pointers, Inf/NaN handling,
// and DeepSpeed's optimizer section.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cpu/kernels.h"
#include "core/error_types.h"
#include "optim/optimizer.h"
#include "tests/optim/lamb_reference.h"
#include "tests/test_util.h"

namespace zeroth {
namespace {

constexpr int kSteps = 20;

struct Case {
  std::string name;
  OptimizerParams params;
};
// ctest and failure messages show the case by name, not as raw bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> cases() {
  std::vector<Case> c;
  OptimizerParams p;
  p.kind = OptimizerKind::adamw, p.lr = 1e-2f, p.weight_decay = 0.1f;
  c.push_back({"AdamW", p});
  p = {};
  p.kind = OptimizerKind::adam, p.lr = 1e-2f, p.weight_decay = 0.05f;
  c.push_back({"AdamL2", p});
  p = {};
  p.kind = OptimizerKind::adamw, p.lr = 1e-2f, p.bias_correction = false, p.beta1 = 0.8f, p.beta2 = 0.99f, p.eps = 1e-6f;
  c.push_back({"AdamWNoBiasCorrection", p});
  p = {};
  p.kind = OptimizerKind::sgd, p.lr = 0.1f, p.weight_decay = 0.01f;
  c.push_back({"SGD", p});
  p = {};
  p.kind = OptimizerKind::sgd, p.lr = 0.1f, p.momentum = 0.9f, p.dampening = 0.1f;
  c.push_back({"SGDMomentum", p});
  p = {};
  p.kind = OptimizerKind::sgd, p.lr = 0.05f, p.momentum = 0.9f, p.nesterov = true, p.weight_decay = 1e-3f;
  c.push_back({"SGDNesterov", p});
  p = {};
  p.kind = OptimizerKind::lion, p.lr = 1e-3f, p.beta1 = 0.9f, p.beta2 = 0.99f, p.weight_decay = 0.1f;
  c.push_back({"Lion", p});
  // The whole array is one tensor; per-tensor norms, clamping and ZeRO splits: lamb_test.cc.
  p = {};
  p.kind = OptimizerKind::lamb, p.lr = 1e-2f, p.weight_decay = 0.01f;
  c.push_back({"Lamb", p});
  return c;
}

// The float64 reference, written from the papers' and PyTorch's formulas.
void reference_step(const OptimizerParams& o, double lr, int64_t t, std::vector<double>& p, const std::vector<double>& g_in,
                    std::vector<double>& m, std::vector<double>& v, std::vector<bool>* lion_ambiguous) {
  if (o.kind == OptimizerKind::lamb) {
    testing::lamb_reference_step(o, lr, t, p, g_in, m, v);
    return;
  }
  const double b1 = o.beta1, b2 = o.beta2, wd = o.weight_decay;
  for (size_t i = 0; i < p.size(); ++i) {
    double g = g_in[i];
    switch (o.kind) {
      case OptimizerKind::adam:
      case OptimizerKind::adamw: {
        if (o.kind == OptimizerKind::adam) g += wd * p[i];
        else p[i] *= 1.0 - lr * wd;
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        const double bc1 = o.bias_correction ? 1 - std::pow(b1, t) : 1, bc2 = o.bias_correction ? 1 - std::pow(b2, t) : 1;
        p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + o.eps);
        break;
      }
      case OptimizerKind::sgd: {
        g += wd * p[i];
        if (o.momentum != 0) {
          m[i] = t == 1 ? g : o.momentum * m[i] + (1 - o.dampening) * g;
          g = o.nesterov ? g + o.momentum * m[i] : m[i];
        }
        p[i] -= lr * g;
        break;
      }
      case OptimizerKind::lamb: break;  // above: the whole array
      case OptimizerKind::lion: {
        const double c = b1 * m[i] + (1 - b1) * g;
        // Where c is within rounding of zero, f32 and f64 may pick different signs.
        if (std::fabs(c) < 1e-6 * (std::fabs(m[i]) + std::fabs(g))) (*lion_ambiguous)[i] = true;
        p[i] = p[i] * (1 - lr * wd) - lr * (c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0);
        m[i] = b2 * m[i] + (1 - b2) * g;
        break;
      }
    }
  }
}

std::vector<float> random_floats(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint8_t> encode(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> out(v.size() * dtype_size(t) + 64);
  cpu::cast(v.data(), DType::f32, out.data(), t, v.size(), cpu::SimdLevel::scalar);
  return out;
}
std::vector<float> decode(const uint8_t* bytes, DType t, size_t n) {
  std::vector<float> v(n);
  cpu::cast(bytes, t, v.data(), DType::f32, n, cpu::SimdLevel::scalar);
  return v;
}

struct Run {
  std::vector<float> p, m, v;
  std::vector<uint8_t> copy;
};

// 20 steps of `o` at `level` with gradients in `gt`, optionally copying out in `ot`.
Run run_steps(const OptimizerParams& o, size_t n, DType gt, bool copy, DType ot, cpu::SimdLevel level, size_t offset = 0,
              int steps = kSteps) {
  // `offset` extra leading elements make every array start unaligned.
  std::vector<float> p(n + offset), m(n + offset, 0.0f), v(n + offset, 0.0f);
  const auto init = random_floats(n, 7, -1.0f, 1.0f);
  std::copy(init.begin(), init.end(), p.begin() + offset);
  std::vector<uint8_t> copy_buf((n + offset) * dtype_size(ot) + 64);
  for (int t = 1; t <= steps; ++t) {
    const auto grads = encode(random_floats(n + offset, 100 + t, -0.05f, 0.05f), gt);
    OptimizerStep s;
    s.params = p.data() + offset;
    s.grads = grads.data() + offset * dtype_size(gt);
    s.grad_type = gt;
    s.state[0] = m.data() + offset;
    s.state[1] = v.data() + offset;
    s.copy_out = copy ? copy_buf.data() + offset * dtype_size(ot) : nullptr;
    s.copy_out_type = ot;
    s.count = n;
    s.step = t;
    s.lr = o.lr * (1.0 - 0.02 * t);  // a schedule: lr changes every step
    s.grad_scale = 0.5f;
    EXPECT_FALSE(cpu_optimizer_step(o, s, level).skipped);
  }
  Run r;
  r.p.assign(p.begin() + offset, p.end());
  r.m.assign(m.begin() + offset, m.end());
  r.v.assign(v.begin() + offset, v.end());
  r.copy.assign(copy_buf.begin() + offset * dtype_size(ot), copy_buf.begin() + (offset + n) * dtype_size(ot));
  return r;
}

class Optimizers : public ::testing::TestWithParam<Case> {};

// After 20 steps, every weight is within 20 x 64 f32 roundings (7.6e-5 relative to |p| + lr) of
// the float64 reference: each step is a handful of correctly rounded f32 operations. The
// printed figures show the actual distance (~1e-7 to 1e-6).
TEST_P(Optimizers, TwentyStepsMatchTheFloat64Reference) {
  const auto& o = GetParam().params;
  const size_t n = 2 * 16384 + 37;  // several parallel chunks and a vector tail
  for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
    for (DType ot : {DType::bf16, DType::f16}) {
      const auto r = run_steps(o, n, gt, true, ot, cpu::active_simd_level());
      std::vector<double> p(n), m(n, 0.0), v(n, 0.0);
      std::vector<bool> ambiguous(n, false);
      const auto init = random_floats(n, 7, -1.0f, 1.0f);
      std::copy(init.begin(), init.end(), p.begin());
      for (int t = 1; t <= kSteps; ++t) {
        const auto grads = encode(random_floats(n, 100 + t, -0.05f, 0.05f), gt);
        const auto g32 = decode(grads.data(), gt, n);
        std::vector<double> g(g32.begin(), g32.end());
        for (auto& x : g) x *= 0.5;
        reference_step(o, o.lr * (1.0 - 0.02 * t), t, p, g, m, v, &ambiguous);
      }
      double worst = 0, worst_m = 0;
      size_t skipped = 0;
      for (size_t i = 0; i < n; ++i) {
        if (ambiguous[i]) {
          ++skipped;
          continue;
        }
        const double err = std::fabs(r.p[i] - p[i]) / (std::fabs(p[i]) + o.lr);
        worst = std::max(worst, err);
        ASSERT_LE(err, 64 * 20 * 0x1p-24) << GetParam().name << " grads " << dtype_name(gt) << " param " << i;
        if (o.state_arrays() > 0) {
          // m is a sum of gradients of both signs and can cancel to ~0: its rounding error scales
          // with the gradients' size (|g| <= 0.025 after the 0.5 scale), not with |m| alone.
          const double em = std::fabs(r.m[i] - m[i]) / (std::fabs(m[i]) + 0.025);
          worst_m = std::max(worst_m, em);
          ASSERT_LE(em, 64 * 20 * 0x1p-24) << "state[0] " << i;
        }
        // The copy-out is the new weight rounded once.
        const float rounded = decode(encode({r.p[i]}, ot).data(), ot, 1)[0];
        ASSERT_EQ(decode(r.copy.data() + i * dtype_size(ot), ot, 1)[0], rounded) << "copy-out " << i;
      }
      EXPECT_LT(skipped, n / 1000) << "too many Lion signs at the rounding edge";
      std::printf("[%s grads %s -> %s] max relative error vs float64: weights %.2e, state %.2e\n", GetParam().name.c_str(),
                  std::string(dtype_name(gt)).c_str(), std::string(dtype_name(ot)).c_str(), worst, worst_m);
    }
  }
}

// Every SIMD level gives the scalar level's bits, on sizes that exercise every tail and on
// arrays that start at an odd element.
TEST_P(Optimizers, EveryLevelIsBitIdenticalToScalarOnOddSizesAndUnalignedPointers) {
  const auto& o = GetParam().params;
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{1000003}}) {
    for (size_t offset : {size_t{0}, size_t{1}}) {
      for (DType gt : {DType::f32, DType::bf16}) {
        const auto ref = run_steps(o, n, gt, true, DType::bf16, cpu::SimdLevel::scalar, offset, 3);
        for (auto level : cpu::supported_simd_levels()) {
          const auto r = run_steps(o, n, gt, true, DType::bf16, level, offset, 3);
          ASSERT_TRUE(r.p == ref.p && r.m == ref.m && r.v == ref.v && r.copy == ref.copy)
              << GetParam().name << " " << cpu::simd_level_name(level) << " n " << n << " offset " << offset;
        }
      }
    }
  }
}

// The fused CUDA kernel does the CPU's operations in the CPU's order: same bits, two shards in
// one launch.
TEST_P(Optimizers, CudaStepGivesTheCpuBits) {
  ZEROTH_SKIP_WITHOUT("cuda");
  const auto& o = GetParam().params;
  auto device = make_device("cuda");
  auto& stream = device->default_stream();
  const size_t sizes[2] = {100003, 17};
  for (DType gt : {DType::f32, DType::bf16}) {
    std::vector<float> p[2], m[2], v[2];
    std::vector<uint8_t> g[2];
    std::vector<Buffer> bufs;
    std::vector<OptimizerStep> shards;
    for (int k = 0; k < 2; ++k) {
      const size_t n = sizes[k];
      p[k] = random_floats(n, 3 + k, -1.0f, 1.0f);
      m[k].assign(n, 0.01f);
      v[k].assign(n, 0.02f);
      g[k] = encode(random_floats(n, 5 + k, -0.05f, 0.05f), gt);
      for (size_t bytes : {n * 4, n * 4, n * 4, g[k].size(), n * 2}) bufs.push_back(device->allocate(bytes, MemTag::other));
      auto* b = &bufs[bufs.size() - 5];
      device->copy(stream, b[0].data(), p[k].data(), n * 4);
      device->copy(stream, b[1].data(), m[k].data(), n * 4);
      device->copy(stream, b[2].data(), v[k].data(), n * 4);
      device->copy(stream, b[3].data(), g[k].data(), g[k].size());
      OptimizerStep st{b[0].as<float>(), b[3].data(), gt, {b[1].as<float>(), b[2].as<float>()}, b[4].data(), DType::bf16, n};
      st.step = 3;
      st.lr = o.lr;
      st.check_finite = false;
      shards.push_back(st);
    }
    ASSERT_FALSE(cuda_optimizer_step(o, shards, stream).skipped);
    for (int k = 0; k < 2; ++k) {
      const size_t n = sizes[k];
      std::vector<uint8_t> copy(n * 2), gpu_copy(n * 2);
      OptimizerStep cpu{p[k].data(), g[k].data(), gt, {m[k].data(), v[k].data()}, copy.data(), DType::bf16, n};
      cpu.step = 3;
      cpu.lr = o.lr;
      cpu_optimizer_step(o, cpu);
      std::vector<float> gp(n), gm(n), gv(n);
      auto* b = &bufs[5 * k];
      device->copy(stream, gp.data(), b[0].data(), n * 4);
      device->copy(stream, gm.data(), b[1].data(), n * 4);
      device->copy(stream, gv.data(), b[2].data(), n * 4);
      device->copy(stream, gpu_copy.data(), b[4].data(), n * 2);
      stream.synchronize();
      EXPECT_TRUE(gp == p[k] && gm == m[k] && gv == v[k] && gpu_copy == copy) << GetParam().name << " shard " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, Optimizers, ::testing::ValuesIn(cases()), [](const auto& info) { return info.param.name; });

// PyTorch 1.13 (Debian python3-torch) on the inputs in tests/reference/optim_torch.json, written
// by tests/reference/optim_reference.py: the same weights after 20 steps within 1e-6 relative to
// the largest value of each array.
TEST(OptimizerTorch, TwentyStepsMatchPyTorch) {
  std::ifstream in(testing::test_data_dir() + "/reference/optim_torch.json");
  ASSERT_TRUE(in) << "missing tests/reference/optim_torch.json";
  const auto ref = nlohmann::json::parse(in);
  const size_t n = ref["n"].get<size_t>();
  const int steps = ref["steps"].get<int>();
  int checked = 0;
  for (const auto& c : ref["cases"]) {
    const std::string name = c["name"];
    const auto& hp = c["params"];
    OptimizerParams o;
    o.lr = hp["lr"].get<double>();
    if (name.starts_with("Adam")) {
      o.kind = name == "AdamW" ? OptimizerKind::adamw : OptimizerKind::adam;
      o.beta1 = hp["betas"][0].get<double>();
      o.beta2 = hp["betas"][1].get<double>();
      o.eps = hp["eps"].get<double>();
    } else {
      o.kind = OptimizerKind::sgd;
      o.momentum = hp.value("momentum", 0.0);
      o.dampening = hp.value("dampening", 0.0);
      o.nesterov = hp.value("nesterov", false);
    }
    o.weight_decay = hp.value("weight_decay", 0.0);
    auto p = ref["init"].get<std::vector<float>>();
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    for (int t = 0; t < steps; ++t) {
      const auto g = ref["grads"][t].get<std::vector<float>>();
      OptimizerStep s{p.data(), g.data(), DType::f32, {m.data(), v.data()}};
      s.count = n;
      s.step = t + 1;
      s.lr = o.lr * ref["lr_scale"][t].get<double>();
      ASSERT_FALSE(cpu_optimizer_step(o, s).skipped);
    }
    // Relative to the array's largest magnitude: weights that cancel to ~0 carry the rounding of
    // the O(1) values they came from, whichever library computed them.
    auto compare = [&](const std::vector<float>& got, const char* key) {
      const auto want = c[key].get<std::vector<float>>();
      double scale = 0, worst = 0, worst_elementwise = 0;
      for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
      for (size_t i = 0; i < n; ++i) {
        const double diff = std::fabs(got[i] - want[i]);
        worst = std::max(worst, diff / scale);
        worst_elementwise = std::max(worst_elementwise, diff / std::max(std::fabs(want[i]), 1e-30f));
        ASSERT_LE(diff / scale, 1e-6) << name << " " << key << "[" << i << "]: " << got[i] << " vs torch " << want[i];
      }
      std::printf("[%s vs torch %s] %s: max difference %.2e of the largest value (element-wise worst %.2e)\n", name.c_str(),
                  ref["torch"].get<std::string>().c_str(), key, worst, worst_elementwise);
    };
    compare(p, "final");
    if (c.contains("exp_avg")) compare(m, "exp_avg"), compare(v, "exp_avg_sq");
    if (c.contains("momentum_buffer")) compare(m, "momentum_buffer");
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

TEST(OptimizerNonfinite, InfOrNanGradientsSkipTheStepUnlessTheCallerChecked) {
  OptimizerParams o;
  const size_t n = 100000;
  std::vector<float> p(n, 1.0f), m(n, 0.0f), v(n, 0.0f), g(n, 0.01f);
  g[54321] = NAN;
  OptimizerStep s{p.data(), g.data(), DType::f32, {m.data(), v.data()}};
  s.count = n;
  const auto before = p;
  EXPECT_TRUE(cpu_optimizer_step(o, s).skipped);
  EXPECT_EQ(p, before) << "a skipped step wrote weights";
  EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](float x) { return x == 0.0f; }));
  g[54321] = INFINITY;
  EXPECT_TRUE(cpu_optimizer_step(o, s).skipped);
  // Asked for (check_finite = false): the non-finite gradient reaches its own weight only.
  s.check_finite = false;
  EXPECT_FALSE(cpu_optimizer_step(o, s).skipped);
  EXPECT_TRUE(std::isnan(p[54321]));
  EXPECT_TRUE(std::isfinite(p[54320]) && std::isfinite(p[54322]));
}

TEST(OptimizerNonfinite, MissingStateIsRejected) {
  OptimizerParams o;
  std::vector<float> p(10), g(10), m(10);
  OptimizerStep s{p.data(), g.data(), DType::f32, {m.data(), nullptr}};
  s.count = 10;
  EXPECT_THROW(cpu_optimizer_step(o, s), InvalidArgument);
  s.state[1] = m.data();
  s.step = 0;
  EXPECT_THROW(cpu_optimizer_step(o, s), InvalidArgument);
}

OptimizerParams parse(const char* text) { return OptimizerParams::from_deepspeed(nlohmann::json::parse(text)); }

std::string error_of(const char* text) {
  try {
    parse(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(OptimizerConfig, DeepSpeedSectionsParseWithDeepSpeedDefaults) {
  auto a = parse(R"({"type": "Adam", "params": {"lr": 0.0002, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.1}})");
  EXPECT_EQ(a.kind, OptimizerKind::adamw) << "DeepSpeed's Adam decouples weight decay by default (adam_w_mode)";
  EXPECT_DOUBLE_EQ(a.lr, 2e-4);
  EXPECT_DOUBLE_EQ(a.beta1, 0.8);
  EXPECT_DOUBLE_EQ(a.eps, 1e-6);
  EXPECT_EQ(parse(R"({"type": "Adam", "params": {"adam_w_mode": false}})").kind, OptimizerKind::adam);
  EXPECT_EQ(parse(R"({"type": "adamw"})").kind, OptimizerKind::adamw);
  auto s = parse(R"({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true}})");
  EXPECT_EQ(s.kind, OptimizerKind::sgd);
  EXPECT_TRUE(s.nesterov);
  EXPECT_EQ(s.state_arrays(), 1);
  auto l = parse(R"({"type": "Lion", "params": {"lr": 1e-4}})");
  EXPECT_EQ(l.kind, OptimizerKind::lion);
  EXPECT_DOUBLE_EQ(l.beta2, 0.999);
}

TEST(OptimizerConfig, MistakesAreNamedWithSuggestions) {
  EXPECT_NE(error_of(R"({"type": "AdamW", "params": {"weight_decy": 0.1}})")
                .find("optimizer.params.weight_decy is not a parameter of AdamW (did you mean 'weight_decay'?)"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type": "Adamw2"})").find("did you mean 'AdamW'"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "OneBitLamb"})").find("zeroth does not support"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "AdamW", "params": {"lr": "auto"}})").find("\"auto\""), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "AdamW", "params": {"betas": [0.9]}})").find("betas must be two numbers"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "AdamW", "params": {"betas": [0.9, 1.0]}})").find("betas[1] = 1"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "SGD", "params": {"momentum": 0.9}})").find("lr is required for SGD"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "AdamW", "params": {"amsgrad": true}})").find("amsgrad"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "AdamW", "parms": {}})").find("did you mean 'params'"), std::string::npos);
}

TEST(OptimizerConfig, LambParsesWithFusedLambsDefaultsAndKeys) {
  const auto d = parse(R"({"type": "Lamb"})");
  EXPECT_EQ(d.kind, OptimizerKind::lamb);
  EXPECT_EQ(d.state_arrays(), 2);
  EXPECT_DOUBLE_EQ(d.lr, 1e-3);
  EXPECT_DOUBLE_EQ(d.beta1, 0.9);
  EXPECT_DOUBLE_EQ(d.beta2, 0.999);
  EXPECT_DOUBLE_EQ(d.eps, 1e-8);
  EXPECT_DOUBLE_EQ(d.weight_decay, 0.0);
  EXPECT_TRUE(d.bias_correction);
  EXPECT_FALSE(d.eps_inside_sqrt);
  EXPECT_DOUBLE_EQ(d.max_coeff, 10.0);
  EXPECT_DOUBLE_EQ(d.min_coeff, 0.01);
  const auto l = parse(R"({"type": "LAMB", "params": {"lr": 0.002, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.01,
      "bias_correction": false, "eps_inside_sqrt": true, "max_coeff": 5, "min_coeff": 0.1, "max_grad_norm": 0, "amsgrad": false}})");
  EXPECT_EQ(l.kind, OptimizerKind::lamb);
  EXPECT_DOUBLE_EQ(l.lr, 0.002);
  EXPECT_DOUBLE_EQ(l.beta1, 0.8);
  EXPECT_DOUBLE_EQ(l.beta2, 0.99);
  EXPECT_DOUBLE_EQ(l.eps, 1e-6);
  EXPECT_DOUBLE_EQ(l.weight_decay, 0.01);
  EXPECT_FALSE(l.bias_correction);
  EXPECT_TRUE(l.eps_inside_sqrt);
  EXPECT_DOUBLE_EQ(l.max_coeff, 5.0);
  EXPECT_DOUBLE_EQ(l.min_coeff, 0.1);
}

TEST(OptimizerConfig, LambKeysItDoesNotHonourAreNamed) {
  EXPECT_NE(error_of(R"({"type": "Lamb", "params": {"max_coef": 5}})")
                .find("optimizer.params.max_coef is not a parameter of Lamb (did you mean 'max_coeff'?)"),
            std::string::npos);
  EXPECT_NE(
      error_of(R"({"type": "Lamb", "params": {"adam_w_mode": true}})").find("optimizer.params.adam_w_mode is not a parameter of Lamb"),
      std::string::npos);
  EXPECT_NE(error_of(R"({"type": "Lamb", "params": {"amsgrad": true}})").find("optimizer.params.amsgrad = true"), std::string::npos);
  const auto clip = error_of(R"({"type": "Lamb", "params": {"max_grad_norm": 1.0}})");
  EXPECT_NE(clip.find("optimizer.params.max_grad_norm = 1"), std::string::npos) << clip;
  EXPECT_NE(clip.find("gradient_clipping"), std::string::npos) << clip;
  EXPECT_NE(error_of(R"({"type": "Lamb", "params": {"max_coeff": 0.5, "min_coeff": 1}})").find("optimizer.params.max_coeff = 0.5"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type": "Lamb", "params": {"min_coeff": -1}})").find("optimizer.params.min_coeff = -1"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "Lamb", "params": {"eps_inside_sqrt": 1}})").find("eps_inside_sqrt must be true or false"),
            std::string::npos);
}

}  // namespace
}  // namespace zeroth
