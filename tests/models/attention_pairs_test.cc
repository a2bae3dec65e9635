// The bf16 pair products of the blocked attention's inner loops (models/kernels/cpu/attention_isa.h)
// against float64 on the same bf16 values, on every ISA level this CPU runs: the AVX-512 level both
// as vdpbf16ps (where the CPU has AVX512-BF16) and as its two fused multiply-adds. Each level must
// give the same bits: the products of bf16 values are exact in f32, and every level adds a pair's
// odd term and then its even term, rounding after each, as vdpbf16ps does (no operand or sum here
// is subnormal, where vdpbf16ps would flush it). Against float64, an element is bounded by the
// rounding of its dot product, gamma(terms + 2) times the sum of the terms' magnitudes (Higham 3.1).
#include <gtest/gtest.h>

#include <algorithm>  // std::max
#include <cmath>      // std::abs, std::ldexp, std::frexp, std::nearbyint
#include <cstdint>    // uint32_t
#include <cstring>    // std::memcmp, std::memcpy
#include <limits>     // std::numeric_limits
#include <random>     // std::mt19937
#include <string>     // std::string
#include <utility>    // std::pair
#include <vector>     // std::vector

#include "core/cpu/kernels.h"  // supported_simd_levels, simd_level_name, cpu_features
#include "models/kernels/cpu/attention_isa.h"
#include "tests/models/causal_product_check.h"

namespace zeroth::gpt::cpu {
namespace {

using Vec = std::vector<float>;

// x rounded to bf16's 8 significant bits, ties to even (frexp's mantissa scaled to 8 bits and
// rounded by nearbyint, in the default rounding mode): not the kernels' bit trick.
float bf16(float x) {
  if (x == 0.0f) return x;
  int e = 0;
  const double m = std::frexp(static_cast<double>(x), &e);  // x = m 2^e, 0.5 <= |m| < 1
  return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8));
}

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// The pair (even, odd) of two values exact in bf16: the low half holds the even term.
uint32_t pair(float even, float odd) { return bits_of(even) >> 16 | (bits_of(odd) & 0xffff0000u); }

// Values exact in bf16, uniform in (-spread, spread).
Vec random_bf16(size_t n, std::mt19937& rng, float spread) {
  std::uniform_real_distribution<float> u(-spread, spread);
  Vec v(n);
  for (float& x : v) x = bf16(u(rng));
  return v;
}

// The levels' loops to compare: every level this CPU runs, and on AVX-512 with AVX512-BF16 its
// emulated pair products too.
std::vector<std::pair<std::string, const AttentionIsa*>> pair_levels() {
  std::vector<std::pair<std::string, const AttentionIsa*>> out;
  for (const auto level : zeroth::cpu::supported_simd_levels()) {
    out.emplace_back(zeroth::cpu::simd_level_name(level), &attention_isa(level));
    if (level == zeroth::cpu::SimdLevel::avx512 && zeroth::cpu::cpu_features().avx512_bf16) {
      out.emplace_back("avx512 without vdpbf16ps", &attention_isa_avx512());
    }
  }
  return out;
}

bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A's terms [m, 2 k] (row i's terms 2p and 2p + 1 in pair p) as pairs, stored [m, k] or [k, m].
std::vector<uint32_t> pairs_of_rows(const Vec& terms, int m, int k, bool transposed) {
  std::vector<uint32_t> out(static_cast<size_t>(m) * k);
  for (int i = 0; i < m; ++i) {
    for (int p = 0; p < k; ++p) {
      const float* t = terms.data() + static_cast<size_t>(i) * 2 * k + 2 * p;
      out[transposed ? static_cast<size_t>(p) * m + i : static_cast<size_t>(i) * k + p] = pair(t[0], t[1]);
    }
  }
  return out;
}

// B's rows [2 k, ldb] as pairs of rows [k, ldb].
std::vector<uint32_t> pairs_of_row_pairs(const Vec& rows, int k, size_t ldb) {
  std::vector<uint32_t> out(static_cast<size_t>(k) * ldb);
  for (int p = 0; p < k; ++p) {
    for (size_t j = 0; j < ldb; ++j) out[p * ldb + j] = pair(rows[2 * p * ldb + j], rows[(2 * p + 1) * ldb + j]);
  }
  return out;
}

// Shapes with every tail (rows past a tile, columns past a vector and a panel, one pair) and
// attention's own: 64 queries x 128 keys x 32 pairs of channels, 64 x 64 x 64 pairs of keys.
TEST(AttentionPairs, ProductsMatchFloat64AndEveryLevelGivesTheSameBits) {
  struct Shape {
    int m, n, k;
  };
  std::mt19937 rng(23);
  double worst = 0;
  for (const auto& [m, n, k] : {Shape{1, 1, 1}, Shape{7, 5, 3}, Shape{6, 16, 9}, Shape{13, 24, 65}, Shape{128, 64, 32},
                                Shape{64, 64, 64}, Shape{5, 33, 17}, Shape{64, 8, 1}}) {
    for (const bool transposed : {false, true}) {
      for (const bool accumulate : {false, true}) {
        SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) + " pairs" +
                     (transposed ? ", A^T" : "") + (accumulate ? ", accumulate" : ""));
        const size_t ldb = n + 3, ldc = n + 5;  // past n: sentinels the product must leave alone
        const Vec a = random_bf16(static_cast<size_t>(m) * 2 * k, rng, 1), b = random_bf16(static_cast<size_t>(2 * k) * ldb, rng, 1),
                  c0 = random_bf16(static_cast<size_t>(m) * ldc, rng, 1);
        const std::vector<uint32_t> a2 = pairs_of_rows(a, m, k, transposed), b2 = pairs_of_row_pairs(b, k, ldb);
        const size_t a_row = transposed ? 1 : k, a_col = transposed ? m : 1;
        const float alpha = 0.375f;
        Vec first_bits;
        for (const auto& [level, isa] : pair_levels()) {
          SCOPED_TRACE(level);
          Vec c = c0;
          isa->pair_product(PairProduct{m, n, k, alpha, a2.data(), a_row, a_col, b2.data(), ldb, c.data(), ldc, accumulate});
          testing::check_product(
              c, c0, m, n, 2 * k, ldc, alpha, accumulate, [&](int i, int p) { return double(a[static_cast<size_t>(i) * 2 * k + p]); },
              [&](int p, int j) { return double(b[p * ldb + j]); }, &worst);
          if (HasFatalFailure()) return;
          if (first_bits.empty()) first_bits = c;
          EXPECT_TRUE(same_bits(c, first_bits)) << level << " differs from the first level's bits";
        }
      }
    }
  }
  std::printf("pair products: worst error %.3f of its bound on %zu level(s)\n", worst, pair_levels().size());
}

// What a diagonal chunk's pair products may leave out (Zeros, whose shift counts terms): every
// element a row wants matches float64 with the same bits on every level, and what the mask hides is
// skipped. A tile runs the pairs of its loosest row, at most 5 rows away, and a pair reaches one term
// further: A holds 0 up to 6 terms past a row's own and NaN beyond, which a tile that summed them
// would carry into C. For columns_before C keeps its sentinel more than 5 + 15 columns before a
// row's first.
TEST(AttentionPairs, CausalProductsSkipOnlyWhatTheMaskMakesNothing) {
  constexpr int kRowReach = 6 - 1, kPairReach = kRowReach + 1, kColumnReach = kRowReach + 16 - 1;
  struct Case {
    Zeros zeros;
    int m, n, k, shift;  // k pairs
  };
  std::mt19937 rng(29);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto& [zeros, m, n, k, shift] :
       {Case{Zeros::columns_before, 128, 64, 32, -64}, Case{Zeros::columns_before, 37, 48, 5, 5}, Case{Zeros::k_after, 64, 64, 64, 64},
        Case{Zeros::k_after, 64, 64, 32, 0}, Case{Zeros::k_after, 19, 40, 35, -3}, Case{Zeros::k_after, 20, 40, 12, 1},
        Case{Zeros::k_before, 128, 64, 32, -64}, Case{Zeros::k_before, 128, 64, 32, 0}, Case{Zeros::k_before, 50, 24, 17, 7},
        Case{Zeros::k_before, 30, 24, 17, -1}}) {
    for (const bool accumulate : {false, true}) {
      SCOPED_TRACE(std::to_string(static_cast<int>(zeros)) + ": " + std::to_string(m) + " x " + std::to_string(n) + " x " +
                   std::to_string(k) + " pairs, shift " + std::to_string(shift) + (accumulate ? ", accumulate" : ""));
      auto term = [&](int i, int p) {
        return zeros == Zeros::k_after ? p <= i + shift : zeros == Zeros::k_before ? p >= i + shift : true;
      };
      auto wanted = [&](int i, int j) { return zeros != Zeros::columns_before || j >= i + shift; };
      Vec a = random_bf16(static_cast<size_t>(m) * 2 * k, rng, 1);
      for (int i = 0; i < m; ++i) {
        for (int p = 0; p < 2 * k; ++p) {
          const int gap = zeros == Zeros::k_after ? p - (i + shift) : (i + shift) - p;
          if (!term(i, p)) a[static_cast<size_t>(i) * 2 * k + p] = gap <= kPairReach ? 0.0f : nan;
        }
      }
      const size_t ldb = n, ldc = n;
      const Vec b = random_bf16(static_cast<size_t>(2 * k) * ldb, rng, 1), c0 = random_bf16(static_cast<size_t>(m) * ldc, rng, 1);
      const std::vector<uint32_t> a2 = pairs_of_rows(a, m, k, false), b2 = pairs_of_row_pairs(b, k, ldb);
      Vec first_bits;
      for (const auto& [level, isa] : pair_levels()) {
        SCOPED_TRACE(level);
        Vec c = c0;
        isa->pair_product(
            PairProduct{m, n, k, 1.0f, a2.data(), static_cast<size_t>(k), 1, b2.data(), ldb, c.data(), ldc, accumulate, zeros, shift});
        Vec bits;
        testing::check_causal_product(c, c0, a, b, m, n, 2 * k, ldb, ldc, accumulate, shift, kColumnReach, term, wanted, &bits);
        if (HasFatalFailure()) return;
        if (first_bits.empty()) first_bits = bits;
        EXPECT_TRUE(same_bits(bits, first_bits)) << "differs from the first level's bits";
      }
    }
  }
}

// A block of pairs transposed: the same 32 bits moved, on every level, whole squares and edges.
TEST(AttentionPairs, TransposedBlocksMoveThePairsWhole) {
  std::mt19937 rng(31);
  for (const int rows : {1, 16, 37, 64}) {
    for (const int width : {8, 32, 35}) {
      SCOPED_TRACE(std::to_string(rows) + " rows of " + std::to_string(width) + " pairs");
      const size_t ld = width + 2;
      std::vector<uint32_t> src(rows * ld);
      for (auto& x : src) x = static_cast<uint32_t>(rng());
      for (const auto& [level, isa] : pair_levels()) {
        SCOPED_TRACE(level);
        std::vector<uint32_t> dst(static_cast<size_t>(width) * kBlockRows, 0xdeadbeefu);
        isa->transpose_pairs(dst.data(), src.data(), rows, ld, width);
        const int lanes = (rows + 15) / 16 * 16;
        for (int c = 0; c < width; ++c) {
          for (int r = 0; r < kBlockRows; ++r) {
            const uint32_t want = r < rows ? src[r * ld + c] : r < lanes ? 0u : 0xdeadbeefu;
            ASSERT_EQ(dst[static_cast<size_t>(c) * kBlockRows + r], want) << "column " << c << ", row " << r;
          }
        }
      }
    }
  }
}

// The softmax passes' bf16 outputs are their f32 results rounded and paired: by pairs of keys
// (softmax_chunk, softmax_grad_chunk) and along each key's lanes (probabilities_chunk,
// softmax_grad_chunk), on every level, with a NaN score kept a NaN; the running max and sum are the
// f32 pass's bits. 37 keys (an odd last key, paired with 0), 16 to 64 lanes.
TEST(AttentionPairs, SoftmaxPassesPairTheirRoundedResults) {
  const int n = 37, Q = kBlockRows;
  std::mt19937 rng(37);
  Vec st0(static_cast<size_t>(n) * Q), dp0(st0.size());
  std::uniform_real_distribution<float> u(-6, 6);
  for (float& x : st0) x = u(rng);
  for (float& x : dp0) x = u(rng) / 6;
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < j % 9; ++i) st0[j * Q + i] = -3.0e38f;  // masked: exp exactly 0
  }
  st0[9 * Q + 3] = std::numeric_limits<float>::quiet_NaN();
  Vec m0(Q), l0(Q), lse(Q), d(Q);
  for (int i = 0; i < Q; ++i) m0[i] = u(rng), l0[i] = 2 + u(rng) / 6, lse[i] = u(rng) / 2, d[i] = u(rng) / 12;
  // The half of a pair that stands for x: x rounded, or a NaN for a NaN.
  auto expect_half = [](uint32_t half, float x, const std::string& where) {
    if (std::isnan(x)) {
      EXPECT_TRUE((half & 0x7f80u) == 0x7f80u && (half & 0x7fu) != 0) << where << ": a NaN lost";
    } else {
      EXPECT_EQ(half, bits_of(bf16(x)) >> 16) << where << ": " << x;
    }
  };
  for (const auto& [level, isa] : pair_levels()) {
    for (const int lanes : {16, 48, 64}) {
      SCOPED_TRACE(level + ", " + std::to_string(lanes) + " lanes");
      const size_t pair_rows = static_cast<size_t>(n + 1) / 2 * Q, along_rows = static_cast<size_t>(n) * Q / 2;
      // softmax_chunk: f32, then in pairs from the same state.
      Vec st = st0, m = m0, l = l0, alpha(Q), m2 = m0, l2 = l0, alpha2(Q), st2 = st0;
      std::vector<uint32_t> pairs(pair_rows);
      isa->softmax_chunk(st.data(), n, lanes, m.data(), l.data(), alpha.data(), false, nullptr);
      isa->softmax_chunk(st2.data(), n, lanes, m2.data(), l2.data(), alpha2.data(), false, pairs.data());
      EXPECT_TRUE(same_bits(st2, st0)) << "the paired softmax wrote the scores";
      for (int i = 0; i < lanes; ++i) {
        ASSERT_EQ(bits_of(m[i]), bits_of(m2[i])) << "max, lane " << i;
        ASSERT_TRUE(bits_of(l[i]) == bits_of(l2[i]) && bits_of(alpha[i]) == bits_of(alpha2[i])) << "sum, lane " << i;
      }
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < lanes; ++i) {
          const uint32_t pr = pairs[static_cast<size_t>(j / 2) * Q + i];
          expect_half(j % 2 == 0 ? pr & 0xffffu : pr >> 16, st[j * Q + i], "exp by pairs of keys, key " + std::to_string(j));
          if (j == n - 1) {
            EXPECT_EQ(pr >> 16, 0u) << "the last key's partner";
          }
        }
      }
      // probabilities_chunk: its f32 result and the same along the lanes.
      Vec p = st0;
      std::vector<uint32_t> along(along_rows);
      isa->probabilities_chunk(p.data(), n, lanes, lse.data(), along.data());
      Vec p_f32 = st0;
      isa->probabilities_chunk(p_f32.data(), n, lanes, lse.data(), nullptr);
      EXPECT_TRUE(same_bits(p, p_f32));
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < lanes; ++i) {
          const uint32_t pr = along[static_cast<size_t>(j) * Q / 2 + i / 2];
          expect_half(i % 2 == 0 ? pr & 0xffffu : pr >> 16, p[j * Q + i], "probability along, key " + std::to_string(j));
        }
      }
      // softmax_grad_chunk on those probabilities: f32, then both pairings.
      Vec ds = dp0, ds2 = dp0;
      std::vector<uint32_t> ds_along(along_rows), ds_pairs(pair_rows);
      isa->softmax_grad_chunk(ds.data(), p.data(), n, lanes, d.data(), 0.125f, nullptr, nullptr);
      isa->softmax_grad_chunk(ds2.data(), p.data(), n, lanes, d.data(), 0.125f, ds_along.data(), ds_pairs.data());
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < lanes; ++i) {
          const uint32_t by_keys = ds_pairs[static_cast<size_t>(j / 2) * Q + i],
                         by_lanes = ds_along[static_cast<size_t>(j) * Q / 2 + i / 2];
          const std::string key = std::to_string(j);
          expect_half(j % 2 == 0 ? by_keys & 0xffffu : by_keys >> 16, ds[j * Q + i], "score gradient by pairs of keys, key " + key);
          expect_half(i % 2 == 0 ? by_lanes & 0xffffu : by_lanes >> 16, ds[j * Q + i], "score gradient along, key " + key);
          if (j == n - 1) {
            EXPECT_EQ(by_keys >> 16, 0u) << "the last key's partner";
          }
        }
      }
    }
  }
}

// The packs of keys, values and a block's rows: rounded and paired along each row or by pairs of
// rows, on every level, over widths past and short of a vector and an odd count of rows or values
// (their last partner 0); nothing written past the pairs asked for.
TEST(AttentionPairs, PacksRoundAndPairAsTheirLayoutsSay) {
  std::mt19937 rng(43);
  for (const int rows : {1, 6, 7}) {
    for (const int width : {5, 16, 64, 70}) {
      SCOPED_TRACE(std::to_string(rows) + " rows of " + std::to_string(width));
      const size_t ld = width + 3, ldd = width + 2;
      Vec src(rows * ld);
      std::uniform_real_distribution<float> u(-4, 4);
      for (float& x : src) x = u(rng);
      auto half = [](uint32_t pr, bool high) { return high ? pr >> 16 : pr & 0xffffu; };
      auto want = [&](int r, int c) { return r < rows && c < width ? bits_of(bf16(src[r * ld + c])) >> 16 : 0u; };
      for (const auto& [level, isa] : pair_levels()) {
        SCOPED_TRACE(level);
        std::vector<uint32_t> along(rows * ldd, 0xdeadbeefu), paired((rows + 1) / 2 * ldd, 0xdeadbeefu);
        isa->pack_along_rows(along.data(), ldd, src.data(), ld, rows, width);
        isa->pack_row_pairs(paired.data(), ldd, src.data(), ld, rows, width);
        for (int r = 0; r < rows; ++r) {
          for (size_t c = 0; c < ldd; ++c) {
            const uint32_t got = along[r * ldd + c];
            if (c >= static_cast<size_t>(width + 1) / 2) {
              ASSERT_EQ(got, 0xdeadbeefu) << "along: wrote past the pairs at " << r << ", " << c;
              continue;
            }
            ASSERT_EQ(half(got, false), want(r, 2 * c)) << "along " << r << ", " << c;
            ASSERT_EQ(half(got, true), want(r, 2 * c + 1)) << "along " << r << ", " << c;
          }
        }
        for (int r = 0; r < (rows + 1) / 2; ++r) {
          for (size_t c = 0; c < ldd; ++c) {
            const uint32_t got = paired[r * ldd + c];
            if (c >= static_cast<size_t>(width)) {
              ASSERT_EQ(got, 0xdeadbeefu) << "by pairs of rows: wrote past the row at " << r << ", " << c;
              continue;
            }
            ASSERT_EQ(half(got, false), want(2 * r, c)) << "by pairs of rows " << r << ", " << c;
            ASSERT_EQ(half(got, true), want(2 * r + 1, c)) << "by pairs of rows " << r << ", " << c;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace zeroth::gpt::cpu
