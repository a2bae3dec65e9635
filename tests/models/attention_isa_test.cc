// The blocked attention's inner loops (models/kernels/cpu/attention_isa.h) on every ISA level this CPU
// runs, against float64 and against each other. Each level must give the scalar level's bits: the
// same fused multiply-adds in the same order, the same exp, the same sums down the keys. Against
// float64, a product's element is bounded by its dot product's rounding, gamma(k + 2) times the sum
// of its terms' magnitudes (Higham 3.1, the fused chain rounds no worse); an exp by its polynomial's
// ~2 ulp plus the rounding of its argument.
#include <gtest/gtest.h>

#include <algorithm>  // std::max
#include <cmath>      // std::abs, std::exp, std::ldexp, std::isnan
#include <cstring>    // std::memcmp
#include <limits>     // std::numeric_limits
#include <random>     // std::mt19937
#include <string>     // std::string
#include <vector>     // std::vector

#include "core/cpu/kernels.h"  // supported_simd_levels, simd_level_name
#include "models/kernels/cpu/attention_isa.h"
#include "tests/models/causal_product_check.h"

namespace zeroth::gpt::cpu {
namespace {

using Vec = std::vector<float>;
const double kU = std::ldexp(1.0, -24);  // f32's unit roundoff

Vec random_vec(size_t n, std::mt19937& rng, float spread) {
  std::uniform_real_distribution<float> u(-spread, spread);
  Vec v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<zeroth::cpu::SimdLevel> levels() { return zeroth::cpu::supported_simd_levels(); }

std::string name(zeroth::cpu::SimdLevel level) { return std::string(zeroth::cpu::simd_level_name(level)); }

bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Shapes with every tail: rows past a tile (6 or 4), columns past a vector and a panel, one-term
// sums, and attention's own (64 queries x 128 keys x 64 channels).
TEST(AttentionIsa, ProductsMatchFloat64AndEveryLevelGivesTheScalarBits) {
  struct Shape {
    int m, n, k;
  };
  std::mt19937 rng(7);
  double worst = 0;
  for (const auto& [m, n, k] : {Shape{1, 1, 1}, Shape{7, 5, 3}, Shape{6, 16, 9}, Shape{13, 24, 130}, Shape{64, 64, 64},
                                Shape{128, 64, 64}, Shape{64, 80, 128}, Shape{5, 33, 17}, Shape{64, 8, 1}}) {
    for (const bool transposed : {false, true}) {
      for (const bool accumulate : {false, true}) {
        SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) + (transposed ? ", A^T" : "") +
                     (accumulate ? ", accumulate" : ""));
        // A stored [m, k] or [k, m]; B's rows and C's rows wider than n, their tails sentinels the
        // product must leave alone.
        const size_t ldb = n + 3, ldc = n + 5;
        const Vec a = random_vec(static_cast<size_t>(m) * k, rng, 1), b = random_vec(static_cast<size_t>(k) * ldb, rng, 1),
                  c0 = random_vec(static_cast<size_t>(m) * ldc, rng, 1);
        const size_t a_row = transposed ? 1 : k, a_col = transposed ? m : 1;
        const float alpha = 0.375f;
        Vec scalar_bits;
        for (const auto level : levels()) {
          SCOPED_TRACE(name(level));
          Vec c = c0;
          attention_isa(level).product(Product{m, n, k, alpha, a.data(), a_row, a_col, b.data(), ldb, c.data(), ldc, accumulate});
          testing::check_product(
              c, c0, m, n, k, ldc, alpha, accumulate, [&](int i, int p) { return double(a[i * a_row + p * a_col]); },
              [&](int p, int j) { return double(b[p * ldb + j]); }, &worst);
          if (HasFatalFailure()) return;
          if (scalar_bits.empty()) scalar_bits = c;
          EXPECT_TRUE(same_bits(c, scalar_bits)) << name(level) << " differs from the scalar level's bits";
        }
      }
    }
  }
  std::printf("products: worst error %.3f of its bound on %zu level(s)\n", worst, levels().size());
}

// exp(x) in f32 against float64: the polynomial's 2 ulp plus x's own rounding, |x| u relative.
double exp_bound(double x, double e) { return (3 + std::abs(x)) * kU * e + std::numeric_limits<float>::denorm_min(); }

// One chunk of 37 keys after an earlier one: maxima that rise and that stay, keys the causal mask
// hides (-3e38: exp exactly 0), scores far below the max (exp 0 under -87), and a NaN score, which
// must come out NaN rather than vanish. Over every number of query lanes a block may use (16 to
// 64); the lanes past them must be left as they were.
TEST(AttentionIsa, SoftmaxPassesMatchFloat64AndEveryLevelGivesTheScalarBits) {
  const int n = 37, Q = kBlockRows;
  std::mt19937 rng(11);
  const Vec st0 = [&] {
    Vec s = random_vec(static_cast<size_t>(n) * Q, rng, 6);
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < j % 9; ++i) s[j * Q + i] = -3.0e38f;  // masked
    }
    s[5 * Q + 40] = -150.0f;  // below exp's range
    return s;
  }();
  const Vec m0 = random_vec(Q, rng, 4), l0 = [&] {
    Vec l = random_vec(Q, rng, 1);
    for (float& x : l) x = 2.0f + x;
    return l;
  }();
  const Vec lse = random_vec(Q, rng, 3), d = random_vec(Q, rng, 0.5f), dp0 = random_vec(static_cast<size_t>(n) * Q, rng, 1);
  std::vector<Vec> scalar_bits;  // the first level's outputs, in the order they are checked
  double worst = 0;
  for (const auto level : levels()) {
    for (const int lanes : {16, 48, 64}) {
      SCOPED_TRACE(name(level) + ", " + std::to_string(lanes) + " lanes");
      const AttentionIsa& isa = attention_isa(level);
      size_t checked = 0;
      auto same_as_first_level = [&](const Vec& bits, const char* what) {
        const size_t at = checked++ + (lanes == 16 ? 0 : lanes == 48 ? 10 : 20);
        if (scalar_bits.size() <= at) scalar_bits.resize(at + 1);
        if (scalar_bits[at].empty()) scalar_bits[at] = bits;
        EXPECT_TRUE(same_bits(bits, scalar_bits[at])) << what << " differs from the first level's bits";
      };
      auto untouched_past = [&](const Vec& got, const Vec& was, int rows, const char* what) {
        for (int j = 0; j < rows; ++j) {
          for (int i = lanes; i < Q; ++i) ASSERT_EQ(got[j * Q + i], was[j * Q + i]) << what << " wrote lane " << i;
        }
      };
      for (const bool first : {true, false}) {
        Vec st = st0, m = m0, l = l0, alpha(Q, -1.0f);
        isa.softmax_chunk(st.data(), n, lanes, m.data(), l.data(), alpha.data(), first, nullptr);
        untouched_past(st, st0, n, "softmax_chunk");
        untouched_past(m, m0, 1, "softmax_chunk's max");
        for (int i = 0; i < lanes; ++i) {
          double mx = first ? -3.0e38 : m0[i];
          for (int j = 0; j < n; ++j) mx = std::max(mx, double(st0[j * Q + i]));
          ASSERT_EQ(m[i], mx) << "max of query " << i;
          double sum = 0, sum_bound = 0;
          for (int j = 0; j < n; ++j) {
            const double x = double(st0[j * Q + i]) - mx, e = std::exp(x);
            const float got = st[j * Q + i];
            if (st0[j * Q + i] == -3.0e38f || x < -87) {
              ASSERT_EQ(got, 0.0f) << "a masked or vanishing score at " << j << ", " << i;
              continue;
            }
            ASSERT_LE(std::abs(got - e), exp_bound(x, e)) << "exp at " << j << ", " << i;
            worst = std::max(worst, std::abs(got - e) / exp_bound(x, e));
            sum += got;
            sum_bound += got;
          }
          // The sum of the chunk's (already checked) exps, in n additions; then the rescale.
          double want = sum, bound = (n + 1) * kU * sum_bound;
          if (!first) {
            const double x = double(m0[i]) - mx, a = std::exp(x);
            ASSERT_LE(std::abs(alpha[i] - a), exp_bound(x, a)) << "rescale of query " << i;
            want += double(l0[i]) * alpha[i];
            bound += 2 * kU * (std::abs(want));
          }
          ASSERT_LE(std::abs(l[i] - want), bound) << "sum of query " << i;
        }
        Vec bits = st;
        bits.insert(bits.end(), m.begin(), m.end());
        bits.insert(bits.end(), l.begin(), l.end());
        if (!first) bits.insert(bits.end(), alpha.begin(), alpha.end());
        same_as_first_level(bits, "softmax_chunk");
      }
      Vec p = st0;
      isa.probabilities_chunk(p.data(), n, lanes, lse.data(), nullptr);
      untouched_past(p, st0, n, "probabilities_chunk");
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < lanes; ++i) {
          const double x = double(st0[j * Q + i]) - lse[i], e = std::exp(x);
          if (x < -87) {
            ASSERT_EQ(p[j * Q + i], 0.0f);
            continue;
          }
          ASSERT_LE(std::abs(p[j * Q + i] - e), exp_bound(x, e)) << "probability at " << j << ", " << i;
        }
      }
      same_as_first_level(p, "probabilities_chunk");
      Vec ds = dp0;
      isa.softmax_grad_chunk(ds.data(), p.data(), n, lanes, d.data(), 0.125f, nullptr, nullptr);
      untouched_past(ds, dp0, n, "softmax_grad_chunk");
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < lanes; ++i) {
          const double want = double(p[j * Q + i]) * (double(dp0[j * Q + i]) - d[i]) * 0.125;
          // Three roundings: the difference, the product, the scale (exact: a power of two).
          ASSERT_LE(std::abs(ds[j * Q + i] - want), 2.01 * kU * std::abs(want)) << "dS at " << j << ", " << i;
        }
      }
      same_as_first_level(ds, "softmax_grad_chunk");

      Vec nan_st = st0, m = m0, l = l0, alpha(Q);
      nan_st[3 * Q + 7] = std::numeric_limits<float>::quiet_NaN();
      isa.softmax_chunk(nan_st.data(), n, lanes, m.data(), l.data(), alpha.data(), false, nullptr);
      EXPECT_TRUE(std::isnan(nan_st[3 * Q + 7])) << "a NaN score's exp is not NaN";
      EXPECT_TRUE(std::isnan(l[7])) << "a NaN score left its query's sum finite";
      for (int i = 0; i < lanes; ++i) {
        if (i != 7) {
          EXPECT_FALSE(std::isnan(l[i])) << "the NaN reached query " << i;
        }
      }
    }
  }
  std::printf("softmax passes: worst exp error %.3f of its bound on %zu level(s)\n", worst, levels().size());
}

// What a diagonal chunk's products may leave out (Zeros): every element a row wants matches
// float64 and has the same bits on every level, and the part the mask hides is really skipped.
// A tile runs the k range of its loosest row, at most 5 rows away (6 rows a tile on any level),
// so A holds 0 up to 5 terms past a row's own and NaN beyond: a tile that summed them would give
// NaN. For columns_before a tile also starts at a whole vector (16 lanes at most), so C keeps its
// sentinel more than 5 + 15 columns before a row's first.
TEST(AttentionIsa, CausalProductsSkipOnlyWhatTheMaskMakesNothing) {
  constexpr int kRowReach = 6 - 1, kColumnReach = kRowReach + 16 - 1;
  struct Case {
    Zeros zeros;
    int m, n, k, shift;
  };
  std::mt19937 rng(13);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto& [zeros, m, n, k, shift] :
       {Case{Zeros::columns_before, 128, 64, 64, -64}, Case{Zeros::columns_before, 64, 64, 64, 0},
        Case{Zeros::columns_before, 37, 48, 9, 5}, Case{Zeros::k_after, 64, 64, 128, 64}, Case{Zeros::k_after, 64, 64, 64, 0},
        Case{Zeros::k_after, 19, 40, 70, -3}, Case{Zeros::k_before, 128, 64, 64, -64}, Case{Zeros::k_before, 128, 64, 64, 0},
        Case{Zeros::k_before, 50, 24, 33, 7}}) {
    for (const bool accumulate : {false, true}) {
      SCOPED_TRACE(std::to_string(static_cast<int>(zeros)) + ": " + std::to_string(m) + " x " + std::to_string(n) + " x " +
                   std::to_string(k) + ", shift " + std::to_string(shift) + (accumulate ? ", accumulate" : ""));
      // Which of row i's terms are something, and which of its columns it wants.
      auto term = [&](int i, int p) {
        return zeros == Zeros::k_after ? p <= i + shift : zeros == Zeros::k_before ? p >= i + shift : true;
      };
      auto wanted = [&](int i, int j) { return zeros != Zeros::columns_before || j >= i + shift; };
      Vec a = random_vec(static_cast<size_t>(m) * k, rng, 1);
      for (int i = 0; i < m; ++i) {
        for (int p = 0; p < k; ++p) {
          const int gap = zeros == Zeros::k_after ? p - (i + shift) : (i + shift) - p;  // how far past the row's terms
          if (!term(i, p)) a[static_cast<size_t>(i) * k + p] = gap <= kRowReach ? 0.0f : nan;
        }
      }
      const size_t ldb = n, ldc = n;
      const Vec b = random_vec(static_cast<size_t>(k) * ldb, rng, 1), c0 = random_vec(static_cast<size_t>(m) * ldc, rng, 1);
      Vec first_bits;
      for (const auto level : levels()) {
        SCOPED_TRACE(name(level));
        Vec c = c0;
        attention_isa(level).product(
            Product{m, n, k, 1.0f, a.data(), static_cast<size_t>(k), 1, b.data(), ldb, c.data(), ldc, accumulate, zeros, shift});
        Vec bits;
        testing::check_causal_product(c, c0, a, b, m, n, k, ldb, ldc, accumulate, shift, kColumnReach, term, wanted, &bits);
        if (HasFatalFailure()) return;
        if (first_bits.empty()) first_bits = bits;
        EXPECT_TRUE(same_bits(bits, first_bits)) << "differs from the first level's bits";
      }
    }
  }
}

// A block's copy, transposed: against its definition on every level, over row counts and widths
// with and without whole 16 x 16 (or 8 x 8) squares; the lanes past the rows are 0 up to the
// rows rounded up to 16 and untouched after.
TEST(AttentionIsa, TransposedBlocksHoldTheRowsAsColumns) {
  constexpr float kSentinel = 12345.0f;
  std::mt19937 rng(17);
  for (const int rows : {1, 7, 16, 17, 40, 63, 64}) {
    for (const int hs : {8, 24, 64, 70}) {
      const size_t ld = hs + 9;
      const Vec src = random_vec(static_cast<size_t>(rows) * ld, rng, 1);
      const int lanes = (rows + 15) / 16 * 16;
      for (const auto level : levels()) {
        SCOPED_TRACE(name(level) + ", " + std::to_string(rows) + " rows of " + std::to_string(hs));
        Vec dst(static_cast<size_t>(hs) * kBlockRows, kSentinel);
        attention_isa(level).transpose(dst.data(), src.data(), rows, ld, hs);
        for (int c = 0; c < hs; ++c) {
          for (int r = 0; r < kBlockRows; ++r) {
            const float want = r < rows ? src[r * ld + c] : r < lanes ? 0.0f : kSentinel;
            ASSERT_EQ(dst[c * kBlockRows + r], want) << "column " << c << ", lane " << r;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace zeroth::gpt::cpu
