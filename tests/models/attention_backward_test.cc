// The CPU attention's backward in two passes (dK and dV by chunks of keys, then dQ by blocks of
// queries: what it runs when key/value heads are fewer than the threads) against its one pass:
// both sum every gradient in the same order, so they must give the same bits, over every gradient
// of q, k and v, on any number of threads. The one pass is checked against the float64 definition
// by DecoderKernels.GroupedQueryAttentionMatchesItsDefinition.
#include <gtest/gtest.h>

#include <cmath>    // std::sin, std::cos
#include <cstring>  // std::memcmp
#include <limits>   // std::numeric_limits
#include <string>   // std::to_string
#include <vector>   // std::vector

#include "models/kernels/cpu/row_kernels.h"

namespace zeroth::gpt::cpu {
namespace {

// dqkv after attention_backward split as `passes`; it starts as NaN, so a gradient left unwritten
// shows.
std::vector<float> backward_in(AttentionPasses passes, const std::vector<float>& qkv, const std::vector<float>& dy, int B, int T,
                               int NH, int KVH, int hs) {
  std::vector<float> out(static_cast<size_t>(B) * T * NH * hs), lse(static_cast<size_t>(B) * NH * T);
  std::vector<float> dqkv(qkv.size(), std::numeric_limits<float>::quiet_NaN());
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, KVH, hs);
  attention_backward(dqkv.data(), dy.data(), out.data(), qkv.data(), lse.data(), B, T, NH, KVH, hs, DType::f32, passes);
  return dqkv;
}

TEST(AttentionBackward, TwoPassesGiveTheOnePassBits) {
  struct Shape {
    int B, T, NH, KVH, hs;
  };
  // Chunks of 128 keys and blocks of 64 rows, with partial ones at the end; one key/value head, and
  // two serving two query heads each; a batch of two over one head.
  for (const auto& [B, T, NH, KVH, hs] : {Shape{1, 300, 4, 1, 24}, Shape{1, 257, 4, 2, 64}, Shape{2, 130, 3, 1, 16}}) {
    SCOPED_TRACE(std::to_string(B) + " x " + std::to_string(T) + ", " + std::to_string(NH) + " heads over " + std::to_string(KVH) +
                 ", head size " + std::to_string(hs));
    const size_t W = static_cast<size_t>(NH + 2 * KVH) * hs;
    std::vector<float> qkv(static_cast<size_t>(B) * T * W), dy(static_cast<size_t>(B) * T * NH * hs);
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = std::sin(0.37f * static_cast<float>(i % 1009));
    for (size_t i = 0; i < dy.size(); ++i) dy[i] = std::cos(0.21f * static_cast<float>(i % 997));
    const std::vector<float> one_pass = backward_in(AttentionPasses::one, qkv, dy, B, T, NH, KVH, hs);
    const std::vector<float> two_passes = backward_in(AttentionPasses::two, qkv, dy, B, T, NH, KVH, hs);
    for (size_t i = 0; i < one_pass.size(); ++i) {
      ASSERT_FALSE(std::isnan(one_pass[i])) << "one pass left element " << i << " unwritten";
      ASSERT_EQ(std::memcmp(&one_pass[i], &two_passes[i], sizeof(float)), 0)
          << "element " << i << " (row " << i / W << ", column " << i % W << "): " << one_pass[i] << " in one pass, " << two_passes[i]
          << " in two";
    }
  }
}

}  // namespace
}  // namespace zeroth::gpt::cpu
