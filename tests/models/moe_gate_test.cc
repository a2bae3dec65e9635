// The mixture-of-experts gate against PyTorch: a gate written from DeepSpeed-MoE's and Mixtral's
// rules in torch ops, with autograd (tests/reference/moe_reference.py, its output checked in as
// moe_gate_torch.json). Choices, which ones are dropped and where the kept ones are placed must be
// equal; weights, losses and the gradient at the logits within f32 rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/moe/router.h"
#include "tests/test_util.h"

namespace zeroth::gpt {
namespace {

nlohmann::json load_cases() {
  std::ifstream in(testing::test_data_dir() + "/reference/moe_gate_torch.json");
  EXPECT_TRUE(in) << "missing tests/reference/moe_gate_torch.json";
  return in ? nlohmann::json::parse(in) : nlohmann::json{{"cases", nlohmann::json::array()}};
}

// max |got - ref| over a tensor, against a bound of `ulps` units of f32 rounding of its largest
// reference magnitude: each element is a sum of at most E + k products of such magnitudes.
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double ulps, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double worst = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
  const double bound = ulps * 0x1p-24 * std::max(scale, 1e-30);
  std::printf("[moe gate] %-40s max |diff| %.3g (bound %.3g)\n", what.c_str(), worst, bound);
  EXPECT_LE(worst, bound) << what;
}

TEST(MoeGate, MatchesPyTorchsGateChoicesDropsWeightsLossesAndGradient) {
  const auto cases = load_cases()["cases"];
  ASSERT_EQ(cases.size(), 6u);
  for (const auto& c : cases) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    MoeGate gate;
    gate.experts = c["E"];
    gate.top_k = c["k"];
    gate.drop_tokens = c["drop_tokens"];
    gate.normalize_top_k = c["normalize_top_k"];
    gate.aux_loss_coef = c["aux_loss_coef"];
    gate.z_loss_coef = c["z_loss_coef"];
    const size_t N = c["N"], E = gate.experts, k = gate.top_k;
    const size_t capacity = moe_capacity(gate, N, c["capacity_factor"], c["min_capacity"]);
    EXPECT_EQ(capacity, c["capacity"].get<size_t>());
    const auto logits = c["logits"].get<std::vector<float>>();
    std::vector<float> probs(N * E);
    const Routing r = moe_route(gate, logits.data(), probs.data(), N, capacity);

    const auto expert = c["expert"].get<std::vector<int32_t>>();
    const auto location = c["location"].get<std::vector<size_t>>();
    const auto kept = c["kept"].get<std::vector<bool>>();
    size_t dropped = 0;
    for (size_t i = 0; i < N * k; ++i) {
      ASSERT_EQ(r.expert[i], expert[i]) << "token " << i / k << " choice " << i % k;
      ASSERT_EQ(r.row[i] >= 0, kept[i]) << "token " << i / k << " choice " << i % k << " at place " << location[i];
      if (!kept[i]) {
        ++dropped;
        continue;
      }
      EXPECT_EQ(static_cast<size_t>(r.row[i]) - r.offsets[expert[i]], location[i]) << "token " << i / k << " choice " << i % k;
      EXPECT_EQ(r.row_token[r.row[i]], static_cast<int32_t>(i / k));
    }
    EXPECT_EQ(r.dropped, dropped);
    if (gate.normalize_top_k && gate.drop_tokens) {
      // Tokens keeping some choices and losing others: where renormalising before and after
      // dropping differ.
      size_t partly = 0;
      for (size_t n = 0; n < N; ++n) {
        size_t held = 0;
        for (size_t j = 0; j < k; ++j) held += kept[n * k + j] ? 1 : 0;
        partly += held > 0 && held < k ? 1 : 0;
      }
      EXPECT_GT(partly, 0u) << "the case must drop some of a token's choices and keep others";
    }
    if (name == "all_to_one_expert") {
      EXPECT_EQ(r.offsets[1] - r.offsets[0], capacity) << "expert 0 takes its capacity and no more";
      EXPECT_DOUBLE_EQ(r.max_load(), static_cast<double>(capacity) * E / r.rows());
    }

    expect_close(r.weight, c["weight"].get<std::vector<float>>(), 8, name + " weights");
    expect_close({static_cast<float>(r.aux_loss)}, {c["aux_loss"].get<float>()}, 4 * E, name + " aux loss");
    expect_close({static_cast<float>(r.z_loss)}, {c["z_loss"].get<float>()}, 16, name + " z loss");
    std::vector<float> dlogits(N * E);
    const auto dweight = c["dweight"].get<std::vector<float>>();
    moe_gate_backward(gate, r, probs.data(), dweight.data(), c["loss_scale"], dlogits.data());
    expect_close(dlogits, c["dlogits"].get<std::vector<float>>(), 16 * (E + k), name + " dlogits");
  }
}

TEST(MoeGate, CapacityFollowsDeepSpeedsRule) {
  MoeGate gate;
  gate.experts = 8;
  gate.top_k = 2;
  EXPECT_EQ(moe_capacity(gate, 1000, 1.0, 4), 250u);   // ceil(1000 x 2 / 8)
  EXPECT_EQ(moe_capacity(gate, 1001, 1.25, 4), 313u);  // ceil(312.8)
  EXPECT_EQ(moe_capacity(gate, 8, 1.0, 4), 4u);        // min_capacity
  EXPECT_EQ(moe_capacity(gate, 3, 1.0, 4), 3u);        // never more than the tokens
  gate.drop_tokens = false;
  EXPECT_EQ(moe_capacity(gate, 1000, 1.0, 4), 1000u);
}

}  // namespace
}  // namespace zeroth::gpt
