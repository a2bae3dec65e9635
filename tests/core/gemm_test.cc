// sgemm and gemm_bf16 against a float64 product, on every library this build has: each orientation, the shape
// classes the models use (tall activations by square or wide weights, attention's small blocks)
// and the edges (empty, K = 0, padded strides, beta 0 over NaN). Each element is bounded by the
// rounding of its own dot product in any summation order: gamma(K + 2) x (|alpha| sum |a||b| +
// |beta c|), with gamma(n) = n u / (1 - n u) and u = 2^-24 (Higham, Accuracy and Stability of
// Numerical Algorithms, 3.1).
#include <gtest/gtest.h>

#include <cmath>      // std::abs, std::isnan
#include <algorithm>  // std::max
#include <cstdint>    // int64_t
#include <limits>     // std::numeric_limits
#include <random>     // std::mt19937
#include <string>     // std::string
#include <vector>     // std::vector

#include <fmt/format.h>

#include "core/cpu/gemm.h"
#include "core/cpu/kernels.h"  // cpu_features
#include "core/dtype.h"        // f32_to_bf16_bits
#include "core/env.h"
#include "core/error.h"

namespace zeroth::cpu {
namespace {

struct Case {
  const char* what;
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
  int64_t pad = 0;  // extra columns in every stored row
};

const Case kCases[] = {
    {"linear forward (x W^T)", false, true, 256, 192, 128, 1.0f, 0.0f},
    {"linear forward with bias in C", false, true, 97, 130, 64, 1.0f, 1.0f},
    {"linear backward, input (dy W)", false, false, 256, 128, 192, 1.0f, 0.0f},
    {"linear backward, weight (dy^T x), accumulated", true, false, 192, 128, 256, 1.0f, 1.0f},
    {"attention scores (q k^T), scaled, strided", false, true, 64, 64, 16, 0.25f, 0.0f, 48},
    {"attention backward (a^T dy), strided", true, false, 64, 16, 64, 1.0f, 1.0f, 48},
    {"both transposed", true, true, 33, 47, 29, -1.5f, 0.5f},
    {"odd sizes", false, false, 37, 53, 29, 2.0f, -1.0f, 3},
    {"one element", false, false, 1, 1, 1, 1.0f, 0.0f},
    {"a row times a matrix", false, true, 1, 300, 77, 1.0f, 0.0f},
    {"K = 0 scales C by beta", false, false, 5, 7, 0, 1.0f, 0.5f},
    {"long dot products", false, true, 8, 8, 4096, 1.0f, 0.0f},
};

std::vector<GemmLibrary> built() {
  std::vector<GemmLibrary> out;
  for (GemmLibrary l : {GemmLibrary::onednn, GemmLibrary::openblas})
    if (gemm_library_built(l)) out.push_back(l);
  return out;
}

// bf16: A and B rounded to bf16 and multiplied by gemm_bf16; the float64 reference takes the
// rounded values.
void check(GemmLibrary library, const Case& c, bool bf16) {
  const int64_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
  const int64_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
  const int64_t lda = std::max<int64_t>(1, a_cols) + c.pad, ldb = std::max<int64_t>(1, b_cols) + c.pad, ldc = c.n + c.pad;
  std::mt19937 rng(static_cast<unsigned>(c.m * 131 + c.n * 7 + c.k));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(std::max<int64_t>(1, a_rows * lda))),
      b(static_cast<size_t>(std::max<int64_t>(1, b_rows * ldb)));
  std::vector<float> cm(static_cast<size_t>(c.m * ldc));
  for (float& x : a) x = bf16 ? bf16_bits_to_f32(f32_to_bf16_bits(u(rng))) : u(rng);
  for (float& x : b) x = bf16 ? bf16_bits_to_f32(f32_to_bf16_bits(u(rng))) : u(rng);
  for (float& x : cm) x = c.beta == 0 ? std::numeric_limits<float>::quiet_NaN() : u(rng);
  const std::vector<float> c0 = cm;
  auto at = [](const std::vector<float>& x, int64_t ld, bool t, int64_t i, int64_t j) { return t ? x[j * ld + i] : x[i * ld + j]; };
  if (bf16) {
    std::vector<uint16_t> a16(a.size()), b16(b.size());
    for (size_t i = 0; i < a.size(); ++i) a16[i] = f32_to_bf16_bits(a[i]);
    for (size_t i = 0; i < b.size(); ++i) b16[i] = f32_to_bf16_bits(b[i]);
    gemm_bf16(library, c.ta, c.tb, c.m, c.n, c.k, c.alpha, a16.data(), lda, b16.data(), ldb, c.beta, cm.data(), ldc);
  } else {
    sgemm(library, c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.beta, cm.data(), ldc);
  }
  const std::string name = fmt::format("{} {}", gemm_library_name(library), bf16 ? "gemm_bf16" : "sgemm");
  const double u_round = std::ldexp(1.0, -24), gamma = (c.k + 2) * u_round / (1 - (c.k + 2) * u_round);
  int bad = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = cm[i * ldc + j];
      if (j >= c.n) {  // the padding of C's rows is never written
        EXPECT_TRUE(std::isnan(got) ? std::isnan(c0[i * ldc + j]) : got == c0[i * ldc + j]) << c.what;
        continue;
      }
      double want = 0, magnitude = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double prod = static_cast<double>(at(a, lda, c.ta, i, p)) * at(b, ldb, c.tb, p, j);
        want += prod;
        magnitude += std::abs(prod);
      }
      want *= c.alpha;
      magnitude *= std::abs(c.alpha);
      if (c.beta != 0) {
        want += static_cast<double>(c.beta) * c0[i * ldc + j];
        magnitude += std::abs(static_cast<double>(c.beta) * c0[i * ldc + j]);
      }
      const double bound = gamma * magnitude;
      if (!(std::abs(got - want) <= bound) && ++bad <= 3) {
        ADD_FAILURE() << name << ", " << c.what << ": C[" << i << "][" << j << "] = " << got << ", float64 " << want << ", bound "
                      << bound;
      }
    }
  }
  EXPECT_EQ(bad, 0) << name << ", " << c.what;
}

TEST(Gemm, EveryOrientationAndShapeAgainstFloat64OnEveryLibrary) {
  ASSERT_FALSE(built().empty());
  for (GemmLibrary library : built())
    for (const Case& c : kCases) check(library, c, false);
}

TEST(Gemm, Bf16ProductsAgainstFloat64OfTheirBf16ValuesOnEveryLibrary) {
  for (GemmLibrary library : built())
    for (const Case& c : kCases) check(library, c, true);
}

TEST(Gemm, TheDefaultLibraryIsOneDnnWhereBuiltOnAvx2) {
  if (const auto named = env::get(env::kGemm)) {
    EXPECT_EQ(gemm_library(), parse_gemm_library(*named));
  } else {
    const bool onednn = gemm_library_built(GemmLibrary::onednn) && cpu_features().avx2 && cpu_features().fma;
    EXPECT_EQ(gemm_library(), onednn ? GemmLibrary::onednn : GemmLibrary::openblas);
  }
  EXPECT_NE(gemm_library_summary(gemm_library()).find(gemm_library() == GemmLibrary::onednn ? "oneDNN " : "OpenBLAS "),
            std::string::npos)
      << gemm_library_summary(gemm_library());
}

TEST(Gemm, BadNamesAndStridesAreRefused) {
  try {
    parse_gemm_library("mkl");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ZEROTH_GEMM=mkl: the CPU matrix products' library must be onednn or openblas"),
              std::string::npos)
        << e.what();
  }
  std::vector<float> x(64, 1.0f);
  for (GemmLibrary library : built()) {
    // lda below A's stored columns (K = 8 without a transpose).
    EXPECT_THROW(sgemm(library, false, false, 4, 4, 8, 1.0f, x.data(), 4, x.data(), 4, 0.0f, x.data(), 4), InvalidArgument);
    EXPECT_THROW(sgemm(library, false, false, -1, 4, 4, 1.0f, x.data(), 4, x.data(), 4, 0.0f, x.data(), 4), InvalidArgument);
    EXPECT_THROW(sgemm(library, false, true, 4, 4, 4, 1.0f, x.data(), 4, x.data(), 4, 0.0f, x.data(), 3), InvalidArgument);
  }
  EXPECT_THROW(set_gemm_threads(0), InvalidArgument);
}

TEST(Gemm, TimingChecksItsProductExactlyOnEveryLibrary) {
  for (GemmLibrary library : built()) {
    // Odd sizes run the edge kernels as well as the main ones.
    for (const auto& [n, bf16] :
         {std::pair{1, false}, std::pair{37, false}, std::pair{256, false}, std::pair{37, true}, std::pair{256, true}}) {
      // The result is checked exactly inside (an Error otherwise).
      const GemmRate r = measure_gemm(n, 3, library, bf16);
      EXPECT_EQ(r.n, n);
      EXPECT_EQ(r.bf16, bf16);
      EXPECT_EQ(r.reps, 3);
    }
  }
  EXPECT_THROW(measure_gemm(0, 3), InvalidArgument);
  EXPECT_THROW(measure_gemm(64, 0), InvalidArgument);
}

}  // namespace
}  // namespace zeroth::cpu
