// The CPU kernels' bf16 products against float64 built from bf16-rounded operands: a linear
// layer's forward (x W^T + b), its input gradient (dy W) and its weight gradient (dy^T x, added),
// with x and dy not exact in bf16, so an activation left unrounded on either pass is seen. Each
// element is bounded by its dot product's rounding in any order, gamma(K + 2) sum |terms| (Higham
// 3.1); the same products without the rounding of x and dy land far outside it, which the test
// checks too, so it cannot pass by accident. ctest runs it on oneDNN and on OpenBLAS
// (models_tests.on_openblas).
#include <gtest/gtest.h>

#include <cmath>    // std::abs, std::ldexp
#include <cstdint>  // uint16_t
#include <random>   // std::mt19937
#include <vector>   // std::vector

#include "core/dtype.h"  // f32_to_bf16_bits
#include "models/kernels/cpu/row_kernels.h"

namespace zeroth::gpt::cpu {
namespace {

double round_bf16(float x) { return bf16_bits_to_f32(f32_to_bf16_bits(x)); }

struct Worst {
  double rounded = 0;    // |got - float64 of rounded operands| / bound, worst element
  double unrounded = 0;  // |got - float64 of unrounded activations| / bound, worst element
};

// got (rows x cols) against sum_p a(i, p) b(p, j) + c0(i, j), both with activations rounded
// (`round_a`) and without.
template <class A, class B>
Worst compare(const std::vector<float>& got, const std::vector<float>& c0, int rows, int cols, int k, A&& a, B&& b) {
  const double gamma = (k + 2) * std::ldexp(1.0, -24) / (1 - (k + 2) * std::ldexp(1.0, -24));
  Worst w;
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      double want = c0.empty() ? 0 : c0[i * cols + j], raw = want, magnitude = std::abs(want);
      for (int p = 0; p < k; ++p) {
        want += a(i, p, true) * b(p, j, true);
        raw += a(i, p, false) * b(p, j, false);
        magnitude += std::abs(a(i, p, true) * b(p, j, true));
      }
      const double bound = gamma * magnitude;
      w.rounded = std::max(w.rounded, std::abs(got[i * cols + j] - want) / bound);
      w.unrounded = std::max(w.unrounded, std::abs(got[i * cols + j] - raw) / bound);
    }
  }
  return w;
}

TEST(Bf16Products, ALinearLayerRoundsItsActivationsForwardAndBackward) {
  const int N = 37, IC = 96, OC = 64;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(N * IC), dy(N * OC), w(OC * IC), bias(OC), dw0(OC * IC);
  std::vector<uint16_t> w16(OC * IC);
  for (float& v : x) v = u(rng);
  for (float& v : dy) v = u(rng);
  for (float& v : bias) v = u(rng);
  for (float& v : dw0) v = u(rng);
  for (size_t i = 0; i < w.size(); ++i) {
    w16[i] = f32_to_bf16_bits(u(rng));
    w[i] = bf16_bits_to_f32(w16[i]);  // a bf16 run's weights: the same numbers both ways
  }
  auto act = [](const std::vector<float>& v, int ld) {
    return [&v, ld](int i, int p, bool rounded) { return rounded ? round_bf16(v[i * ld + p]) : static_cast<double>(v[i * ld + p]); };
  };
  // Forward: out[N, OC] = x W^T + b.
  std::vector<float> out(N * OC), bias_rows(N * OC);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < OC; ++j) bias_rows[i * OC + j] = bias[j];
  matmul_forward(out.data(), x.data(), w.data(), bias.data(), N, IC, OC, w16.data());
  const Worst f = compare(out, bias_rows, N, OC, IC, act(x, IC),
                          [&](int p, int j, bool) { return static_cast<double>(w[j * IC + p]); });
  // Backward: dinp[N, IC] = dy W; dweight[OC, IC] += dy^T x.
  std::vector<float> dinp(N * IC), dw = dw0;
  matmul_backward(dinp.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), N, IC, OC, w16.data());
  const Worst di = compare(dinp, {}, N, IC, OC, act(dy, OC), [&](int p, int j, bool) { return static_cast<double>(w[p * IC + j]); });
  const auto dy_t = [&](int i, int p, bool rounded) { return act(dy, OC)(p, i, rounded); };
  const Worst dwe = compare(dw, dw0, OC, IC, N, dy_t, act(x, IC));
  for (const auto& [what, worst] : {std::pair{"forward", f}, std::pair{"input gradient", di}, std::pair{"weight gradient", dwe}}) {
    EXPECT_LE(worst.rounded, 1.0) << what << ": beyond the bound of the rounded operands' product";
    EXPECT_GT(worst.unrounded, 10.0) << what << ": as close to the unrounded product, so the rounding is not seen";
  }
}

}  // namespace
}  // namespace zeroth::gpt::cpu
