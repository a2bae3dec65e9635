// What the tests of models/ share: random inputs, f32 arrays on the test's device, the per-element
// check against a float64 reference with the f32 error bound of its sums, and the per-tensor
// error against a PyTorch reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/device.h"

namespace zeroth::testing {

using Vec = std::vector<float>;

inline Vec random_vec(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// f32 arrays on the test's device, in and out.
struct OnDevice {
  Device& device;
  std::vector<Buffer> held;
  float* put(const Vec& v) {
    held.push_back(device.allocate(std::max<size_t>(v.size(), 1) * sizeof(float), MemTag::other));
    device.copy(device.default_stream(), held.back().data(), v.data(), v.size() * sizeof(float));
    device.default_stream().synchronize();  // the copy is in stream order; `v` may be a temporary
    return held.back().as<float>();
  }
  float* zeros(size_t n) { return put(Vec(n, 0.0f)); }
  Vec get(const float* p, size_t n) {
    Vec v(n);
    device.copy(device.default_stream(), v.data(), p, n * sizeof(float));
    device.default_stream().synchronize();
    return v;
  }
};

// |got - want| <= the float32 error bound of a sum of k products: k u sum |terms| (u = 2^-24), per
// element, plus the rounding of the result itself.
inline void expect_within_sum_bound(const char* what, const Vec& got, const std::vector<double>& want,
                                    const std::vector<double>& abs_sum, int k) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = (k + 2) * 0x1.0p-24 * abs_sum[i] + 0x1.0p-24 * std::abs(want[i]);
    const double err = std::abs(got[i] - want[i]);
    worst = std::max(worst, err / bound);
    ASSERT_LE(err, bound) << what << "[" << i << "]: " << got[i] << " against " << want[i];
  }
  std::printf("%s: worst error %.2f of its bound\n", what, worst);
}

// Largest |a - b| relative to the largest |b|: one number per tensor, printed as evidence.
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

}  // namespace zeroth::testing
