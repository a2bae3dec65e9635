// The bit-for-bit comparison of two MLP trainings that the offload-order tests share: every
// step's loss, gradient norm (as bits: an overflowed step's is NaN) and skipped flag, the final
// weights, and every master weight and moment the ranks held at the end.
#pragma once

#include <gtest/gtest.h>

#include <bit>      // std::bit_cast
#include <cstdint>  // uint64_t
#include <vector>   // std::vector

#include "tests/engine/mlp_harness.h"

namespace zeroth::testing {

inline void expect_same_training(const std::vector<RankResult>& got, FinalState& got_state, const std::vector<RankResult>& want,
                                 FinalState& want_state) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    ASSERT_EQ(got[r].steps.size(), want[r].steps.size());
    for (size_t k = 0; k < want[r].steps.size(); ++k) {
      EXPECT_EQ(got[r].losses[k], want[r].losses[k]) << "rank " << r << " step " << k;
      EXPECT_EQ(std::bit_cast<uint64_t>(got[r].steps[k].grad_norm), std::bit_cast<uint64_t>(want[r].steps[k].grad_norm))
          << "rank " << r << " step " << k << ": " << got[r].steps[k].grad_norm << " against " << want[r].steps[k].grad_norm;
      EXPECT_EQ(got[r].steps[k].skipped, want[r].steps[k].skipped) << "rank " << r << " step " << k;
    }
    EXPECT_EQ(got[r].weights, want[r].weights) << "rank " << r;
    const auto& a = got_state.by_rank.at(static_cast<int>(r));
    const auto& b = want_state.by_rank.at(static_cast<int>(r));
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "rank " << r << " block " << i / 3 << " array " << i % 3;
  }
}

}  // namespace zeroth::testing
