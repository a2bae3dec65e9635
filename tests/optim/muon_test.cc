// Muon against an independent PyTorch reference (tests/reference/muon_reference.py, float64, written
// from Keller Jordan's muon.py): 10 steps on a tall, a wide and a square matrix, with Nesterov
// momentum and weight decay, without Nesterov, and with Moonlight's scale and 3 iterations; the
// weights and the momentum buffer within f32's rounding of the reference. Shown to fail when the
// iteration runs on half of the matrix's rows (as a rank holding a shard would) instead of all.
#include <gtest/gtest.h>

#include <algorithm>  // std::max
#include <cmath>      // std::fabs
#include <fstream>    // std::ifstream
#include <string>     // std::string
#include <vector>     // std::vector

#include <nlohmann/json.hpp>

#include "core/error_types.h"  // InvalidArgument
#include "optim/muon.h"
#include "tests/test_util.h"

namespace zeroth {
namespace {

// The largest difference relative to the reference's largest magnitude.
double worst_relative(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 0, worst = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]) / scale);
  return worst;
}

MuonParams params_of(const nlohmann::json& hp) {
  MuonParams o;
  o.momentum = hp["momentum"].get<double>();
  o.nesterov = hp["nesterov"].get<bool>();
  o.ns_steps = hp["ns_steps"].get<int>();
  o.weight_decay = hp["weight_decay"].get<double>();
  o.scale = hp["scale"].get<std::string>() == "keller" ? MuonScale::keller : MuonScale::match_adamw_rms;
  return o;
}

// The reference's steps; with `shards`, each step's iteration runs on the first half of the rows and
// then on the second apart, as two ranks holding a shard each would.
struct Trained {
  std::vector<float> param, momentum;
};
Trained run(const nlohmann::json& shape, const nlohmann::json& c, const std::vector<double>& lr_scale, bool shards) {
  const int64_t rows = shape["rows"].get<int64_t>(), cols = shape["cols"].get<int64_t>();
  const MuonParams o = params_of(c["params"]);
  Trained r{shape["init"].get<std::vector<float>>(), std::vector<float>(static_cast<size_t>(rows * cols), 0.0f)};
  std::vector<float> scratch(muon_scratch_floats(rows, cols));
  for (size_t t = 0; t < lr_scale.size(); ++t) {
    const auto g = shape["grads"][t].get<std::vector<float>>();
    const double lr = c["params"]["lr"].get<double>() * lr_scale[t];
    if (!shards) {
      cpu_muon_step(o, {r.param.data(), g.data(), r.momentum.data(), rows, cols, lr}, scratch.data());
      continue;
    }
    const int64_t half = rows / 2;
    for (int64_t first : {int64_t{0}, half}) {
      const int64_t n = first == 0 ? half : rows - half;
      const size_t at = static_cast<size_t>(first * cols);
      cpu_muon_step(o, {r.param.data() + at, g.data() + at, r.momentum.data() + at, n, cols, lr}, scratch.data());
    }
  }
  return r;
}

TEST(Muon, TenStepsMatchTheReference) {
  std::ifstream in(testing::test_data_dir() + "/reference/muon_torch.json");
  ASSERT_TRUE(in) << "missing tests/reference/muon_torch.json";
  const auto ref = nlohmann::json::parse(in);
  const auto lr_scale = ref["lr_scale"].get<std::vector<double>>();
  int checked = 0;
  for (const auto& shape : ref["shapes"]) {
    for (const auto& c : shape["cases"]) {
      const std::string name = c["name"].get<std::string>() + " " + std::to_string(shape["rows"].get<int>()) + " x " +
                               std::to_string(shape["cols"].get<int>());
      SCOPED_TRACE(name);
      const Trained r = run(shape, c, lr_scale, false);
      // f32 against float64: the normalised iterate's entries are ~1 / sqrt(rows cols), each
      // product's sums round at 2^-24 of their terms and the quintic's coefficients (|b| = 4.8)
      // grow an error a few times a step; over 10 updates the worst seen is 2.3e-7 of the weights'
      // largest value, under a bound of 1e-6.
      const double w = worst_relative(r.param, c["final"].get<std::vector<double>>());
      const double m = worst_relative(r.momentum, c["momentum_buffer"].get<std::vector<double>>());
      EXPECT_LT(w, 1e-6);
      EXPECT_LT(m, 1e-6);
      // The same matrix orthogonalised by halves moves the weights by a different update: far
      // outside that bound (a rank of a partitioned optimizer must gather the whole matrix).
      if (shape["rows"].get<int>() >= 12) {
        const Trained halves = run(shape, c, lr_scale, true);
        EXPECT_GT(worst_relative(halves.param, c["final"].get<std::vector<double>>()), 100 * 1e-6);
      }
      std::printf("%-22s worst weight error %.3g, momentum %.3g of the largest value\n", name.c_str(), w, m);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 9);
}

TEST(Muon, TheScaleFollowsTheMatrixShape) {
  EXPECT_DOUBLE_EQ(muon_update_scale(MuonScale::keller, 4096, 1024), 2.0);  // a tall matrix's sqrt(rows / cols)
  EXPECT_DOUBLE_EQ(muon_update_scale(MuonScale::keller, 1024, 4096), 1.0);  // at least 1
  EXPECT_DOUBLE_EQ(muon_update_scale(MuonScale::match_adamw_rms, 1024, 4096), 0.2 * 64);
}

TEST(Muon, ANonMatrixIsRefused) {
  std::vector<float> p(4), g(4), m(4), s(64);
  EXPECT_THROW(cpu_muon_step(MuonParams{}, {p.data(), g.data(), m.data(), 0, 4, 0.02}, s.data()), InvalidArgument);
  EXPECT_THROW(cpu_muon_step(MuonParams{}, {p.data(), nullptr, m.data(), 2, 2, 0.02}, s.data()), InvalidArgument);
}

}  // namespace
}  // namespace zeroth
