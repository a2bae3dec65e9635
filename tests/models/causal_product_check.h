// What the tests of the attention's products (attention_isa_test.cc on floats,
// attention_pairs_test.cc on bf16 pairs) check of one product's C.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>  // std::max
#include <cmath>      // std::abs, std::ldexp
#include <cstddef>    // size_t
#include <vector>     // std::vector

namespace zeroth::gpt::cpu::testing {

// gamma(k + 2) (Higham 3.1): a k-term dot product's rounding, the fused chain's no worse.
inline double dot_bound(int k, double magnitude) {
  const double u = std::ldexp(1.0, -24);
  return (k + 2) * u / (1 - (k + 2) * u) * magnitude;
}

// C = alpha A B (+ c0 where `accumulate`), rows ldc apart, against float64: each of a row's first n
// elements within dot_bound of its k terms a(i, p) b(p, j) (and c0's), the columns past n holding
// c0's values. *worst keeps the largest error over its bound.
template <class A, class B>
void check_product(const std::vector<float>& c, const std::vector<float>& c0, int m, int n, int k, size_t ldc, float alpha,
                   bool accumulate, A a, B b, double* worst) {
  for (int i = 0; i < m; ++i) {
    for (size_t j = 0; j < ldc; ++j) {
      const float got = c[i * ldc + j];
      if (j >= static_cast<size_t>(n)) {
        ASSERT_EQ(got, c0[i * ldc + j]) << "wrote past the row's n columns at " << i << ", " << j;
        continue;
      }
      double want = 0, magnitude = 0;
      for (int p = 0; p < k; ++p) {
        const double t = a(i, p) * b(p, static_cast<int>(j));
        want += t, magnitude += std::abs(t);
      }
      want *= alpha, magnitude *= alpha;
      if (accumulate) want += c0[i * ldc + j], magnitude += std::abs(c0[i * ldc + j]);
      const double bound = dot_bound(k, magnitude);
      ASSERT_LE(std::abs(got - want), bound) << "at " << i << ", " << j;
      *worst = std::max(*worst, std::abs(got - want) / bound);
    }
  }
}

// C [m, n] (rows ldc apart) against float64: each element row i wants (wanted(i, j)) within
// gamma(k + 2) of the sum of its terms' magnitudes (Higham 3.1), its terms the p < k with term(i, p),
// each a[i k + p] b[p ldb + j], plus c0's element where `accumulate`. An element wanted by no row
// more than `reach` columns before the row's first (i + shift) must hold c0's value: computing it
// would mean the tile did not skip it. The wanted elements go to `bits`, in order.
template <class Term, class Wanted>
void check_causal_product(const std::vector<float>& c, const std::vector<float>& c0, const std::vector<float>& a,
                          const std::vector<float>& b, int m, int n, int k, size_t ldb, size_t ldc, bool accumulate, int shift,
                          int reach, Term term, Wanted wanted, std::vector<float>* bits) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      const float got = c[i * ldc + j];
      if (!wanted(i, j)) {
        if (j < i + shift - reach) {
          ASSERT_EQ(got, c0[i * ldc + j]) << "computed hidden " << i << ", " << j;
        }
        continue;
      }
      double want = accumulate ? c0[i * ldc + j] : 0, magnitude = std::abs(want);
      for (int p = 0; p < k; ++p) {
        if (!term(i, p)) continue;
        const double t = double(a[static_cast<size_t>(i) * k + p]) * b[p * ldb + j];
        want += t, magnitude += std::abs(t);
      }
      ASSERT_LE(std::abs(got - want), dot_bound(k, magnitude)) << "at " << i << ", " << j;
      bits->push_back(got);
    }
  }
}

}  // namespace zeroth::gpt::cpu::testing
