// The sampler against its closed form: logits 0, ln 2, ln 4 are probabilities 1/7, 2/7, 4/7; a
// draw u picks the most likely token for u < 4/7, the next for u < 6/7, the last above; top-k and
// top-p renormalize what they keep; temperature T takes the logits over T; greedy takes the
// largest (the lowest id among equals).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "train/generate.h"

namespace zeroth {
namespace {

TEST(Sampling, DrawsFollowTheClosedForm) {
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(4.0f), 100.0f};  // the last id is outside the vocabulary
  GenerateOptions o;
  o.temperature = 1.0, o.top_k = 0, o.top_p = 1.0;
  auto pick = [&](double u) { return sample_token(logits, 3, o, u); };
  EXPECT_EQ(pick(0.0), 2);
  EXPECT_EQ(pick(4.0 / 7 - 1e-6), 2);
  EXPECT_EQ(pick(4.0 / 7 + 1e-6), 1);
  EXPECT_EQ(pick(6.0 / 7 - 1e-6), 1);
  EXPECT_EQ(pick(6.0 / 7 + 1e-6), 0);
  EXPECT_EQ(pick(0.999999), 0);
  o.top_k = 2;  // 4/6 and 2/6
  EXPECT_EQ(pick(4.0 / 6 - 1e-6), 2);
  EXPECT_EQ(pick(4.0 / 6 + 1e-6), 1);
  EXPECT_EQ(pick(0.999999), 1);
  o.top_k = 0, o.top_p = 0.5;  // 4/7 already holds half
  EXPECT_EQ(pick(0.999999), 2);
  o.top_p = 0.6;  // 4/7 does not: 2/7 joins
  EXPECT_EQ(pick(4.0 / 6 + 1e-6), 1);
  o.top_p = 1.0, o.temperature = 2.0;  // weights 1, sqrt 2, 2 over 3 + sqrt 2
  const double z = 3.0 + std::sqrt(2.0);
  EXPECT_EQ(pick(2.0 / z - 1e-6), 2);
  EXPECT_EQ(pick(2.0 / z + 1e-6), 1);
  EXPECT_EQ(pick((2.0 + std::sqrt(2.0)) / z + 1e-6), 0);
  o.temperature = 0;
  EXPECT_EQ(pick(0.5), 2);
  EXPECT_EQ(sample_token({1.0f, 3.0f, 3.0f}, 3, o, 0.5), 1);
}

}  // namespace
}  // namespace zeroth
