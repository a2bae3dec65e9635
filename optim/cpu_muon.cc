// Muon on the CPU (muon.h): the elementwise passes in plain loops, the Newton-Schulz products on
// the GEMM library (core/cpu/gemm.h), which threads them.
#include "optim/muon.h"

#include <algorithm>  // std::copy_n, std::swap, std::max, std::min
#include <cmath>      // std::sqrt

#include "core/cpu/gemm.h"  // cpu::sgemm
#include "core/error.h"     // ZEROTH_THROW

namespace zeroth {

namespace {

// Keller Jordan's quintic: the coefficients that push every singular value of the normalised
// iterate towards 1 fastest from 0 (not exactly to 1: to within about [0.7, 1.2]).
constexpr float kA = 3.4445f, kB = -4.7750f, kC = 2.0315f;

// dst [cols, rows] = src [rows, cols]^T, by tiles that stay in cache on both sides (a tall matrix's
// way in and out of the iteration).
void transpose(const float* src, float* dst, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 32;
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const int64_t i1 = std::min(rows, i0 + kTile), j1 = std::min(cols, j0 + kTile);
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < j1; ++j) dst[j * rows + i] = src[i * cols + j];
      }
    }
  }
}

}  // namespace

size_t muon_scratch_floats(int64_t rows, int64_t cols) {
  const size_t n = static_cast<size_t>(std::min(rows, cols)), m = static_cast<size_t>(std::max(rows, cols));
  return 3 * n * m + 2 * n * n;
}

double muon_update_scale(MuonScale scale, int64_t rows, int64_t cols) {
  const double r = static_cast<double>(rows), c = static_cast<double>(cols);
  if (scale == MuonScale::match_adamw_rms) return 0.2 * std::sqrt(std::max(r, c));
  return std::sqrt(std::max(1.0, r / c));
}

void newton_schulz(const float* u, float* out, int64_t rows, int64_t cols, int steps, float* scratch) {
  // The iteration multiplies by X X^T, the shorter side squared: a tall matrix goes transposed.
  const bool tall = rows > cols;
  const int64_t n = tall ? cols : rows, m = tall ? rows : cols;
  const size_t nm = static_cast<size_t>(n) * m;
  float *x = scratch, *y = x + nm, *a = y + nm, *b = a + static_cast<size_t>(n) * n;
  double sum = 0;
  for (size_t k = 0; k < nm; ++k) sum += static_cast<double>(u[k]) * u[k];
  if (tall) {
    transpose(u, x, rows, cols);
  } else {
    std::copy_n(u, nm, x);
  }
  const float inverse = static_cast<float>(1.0 / (std::sqrt(sum) + 1e-7));
  for (size_t k = 0; k < nm; ++k) x[k] *= inverse;
  for (int s = 0; s < steps; ++s) {
    cpu::sgemm(false, true, n, n, m, 1.0f, x, m, x, m, 0.0f, a, n);  // A = X X^T
    cpu::sgemm(false, false, n, n, n, kC, a, n, a, n, 0.0f, b, n);   // B = c A A
    for (size_t k = 0; k < static_cast<size_t>(n) * n; ++k) b[k] += kB * a[k];
    for (size_t k = 0; k < nm; ++k) y[k] = kA * x[k];
    cpu::sgemm(false, false, n, m, n, 1.0f, b, n, x, m, 1.0f, y, m);  // X' = a X + B X
    std::swap(x, y);
  }
  if (tall) {
    transpose(x, out, n, m);
  } else {
    std::copy_n(x, nm, out);
  }
}

void cpu_muon_step(const MuonParams& params, const MuonStep& step, float* scratch) {
  if (step.rows < 1 || step.cols < 1) ZEROTH_THROW(InvalidArgument, "Muon updates a matrix: got {} x {}", step.rows, step.cols);
  if (step.param == nullptr || step.grad == nullptr || step.momentum == nullptr || scratch == nullptr)
    ZEROTH_THROW(InvalidArgument, "Muon step of a {} x {} matrix: a pointer is missing", step.rows, step.cols);
  const size_t count = static_cast<size_t>(step.rows) * step.cols;
  const float beta = static_cast<float>(params.momentum), gain = static_cast<float>(1.0 - params.momentum);
  float* u = scratch;  // the matrix to orthogonalise, then its orthogonalised form
  for (size_t i = 0; i < count; ++i) {
    const float g = step.grad[i] * step.grad_scale;
    float& m = step.momentum[i];
    m += gain * (g - m);                              // torch's lerp_(g, 1 - beta)
    u[i] = params.nesterov ? g + beta * (m - g) : m;  // g.lerp_(m, beta)
  }
  newton_schulz(u, u, step.rows, step.cols, params.ns_steps, u + count);
  const float decay = static_cast<float>(1.0 - step.lr * params.weight_decay);
  const float rate = static_cast<float>(step.lr * muon_update_scale(params.scale, step.rows, step.cols));
  for (size_t i = 0; i < count; ++i) step.param[i] = step.param[i] * decay - rate * u[i];
}

}  // namespace zeroth
