// Ring attention's blocks against the float64 definition of causal attention: one sequence of 2C
// chunks, each rank's two chunks (r and 2C-1-r) attending to every rank's keys in the ring's order
// (ring_blocks), merged by their log-sum-exp, give the whole sequence's output; the blocks' backward
// from the merged output and log-sum-exp adds up to the whole gradient of q, k and v. The schedule
// gives every rank the same causal work.
#include <gtest/gtest.h>

#include <algorithm>  // std::minmax_element, std::max
#include <cmath>      // std::exp, std::sqrt, std::abs
#include <random>     // std::mt19937
#include <string>     // std::to_string
#include <vector>     // std::vector

#include "models/decoder/context_ring.h"  // ring_blocks, ring_chunk
#include "models/kernels/cpu/row_kernels.h"

namespace zeroth::gpt {
namespace {

// f32 against float64: sums of at most T = 780 terms of magnitude ~1 (normal inputs), whose worst
// here is 1.2e-6; a merge 3% off in one block's weight is off by 4e-3. bf16 products round every
// operand to 8 bits (2^-9 relative), the probabilities and score gradients too: 0.018 at worst
// here; that bound checks the paired operands' layouts (a wrong stride or block is off by 1e-1 or
// more), the f32 runs the arithmetic.
constexpr double kF32Bound = 5e-6, kBf16Bound = 5e-2;

struct Shape {
  int C, c, NH, KVH, hs;
};

// Causal attention of one sequence qkv [T, W] in float64: out [T, Cq] and dqkv [T, W] for dy.
void definition(const std::vector<float>& qkv, const std::vector<float>& dy, int T, int NH, int KVH, int hs, std::vector<double>& out,
                std::vector<double>& dqkv) {
  const int W = (NH + 2 * KVH) * hs, Cq = NH * hs, g = NH / KVH;
  const double scale = 1.0 / std::sqrt(double(hs));
  out.assign(static_cast<size_t>(T) * Cq, 0.0), dqkv.assign(static_cast<size_t>(T) * W, 0.0);
  for (int h = 0; h < NH; ++h) {
    const int q0 = h * hs, k0 = (NH + h / g) * hs, v0 = (NH + KVH + h / g) * hs;
    for (int t = 0; t < T; ++t) {
      std::vector<double> p(t + 1);
      double m = -1e300, z = 0;
      for (int j = 0; j <= t; ++j) {
        double s = 0;
        for (int i = 0; i < hs; ++i) s += double(qkv[t * W + q0 + i]) * qkv[j * W + k0 + i];
        p[j] = s * scale, m = std::max(m, p[j]);
      }
      for (double& x : p) z += x = std::exp(x - m);
      for (double& x : p) x /= z;
      for (int i = 0; i < hs; ++i) {
        for (int j = 0; j <= t; ++j) out[t * Cq + q0 + i] += p[j] * qkv[j * W + v0 + i];
      }
      // dP = dy v, dS = P (dP - <P, dP>), dq = scale dS k, dk = scale dS^T q, dv = P^T dy.
      std::vector<double> dp(t + 1);
      double dot = 0;
      for (int j = 0; j <= t; ++j) {
        for (int i = 0; i < hs; ++i) dp[j] += double(dy[t * Cq + q0 + i]) * qkv[j * W + v0 + i];
        dot += p[j] * dp[j];
      }
      for (int j = 0; j <= t; ++j) {
        const double ds = p[j] * (dp[j] - dot) * scale;
        for (int i = 0; i < hs; ++i) {
          dqkv[t * W + q0 + i] += ds * qkv[j * W + k0 + i];
          dqkv[j * W + k0 + i] += ds * qkv[t * W + q0 + i];
          dqkv[j * W + v0 + i] += p[j] * dy[t * Cq + q0 + i];
        }
      }
    }
  }
}

TEST(RingBlocks, MergedBlocksAreTheWholeAttention) {
  for (const auto& [C, c, NH, KVH, hs] :
       {Shape{2, 5, 2, 1, 8}, Shape{4, 3, 4, 2, 8}, Shape{2, 70, 3, 1, 16}, Shape{3, 130, 2, 2, 8}}) {
    SCOPED_TRACE("C " + std::to_string(C) + ", chunks of " + std::to_string(c) + ", " + std::to_string(NH) + " heads over " +
                 std::to_string(KVH));
    const int T = 2 * C * c, W = (NH + 2 * KVH) * hs, Cq = NH * hs, Wkv = 2 * KVH * hs;
    std::mt19937 rng(7 + C * 10 + c);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> qkv(static_cast<size_t>(T) * W), dy(static_cast<size_t>(T) * Cq);
    for (float& x : qkv) x = normal(rng);
    for (float& x : dy) x = normal(rng);
    std::vector<double> want, dwant;
    definition(qkv, dy, T, NH, KVH, hs, want, dwant);
    // f32 products in one backward pass and in two (a task per key/value head, or dK and dV by
    // chunks of keys then dQ: each block's gradients are added either way), and bf16 products.
    struct Variant {
      const char* name;
      DType products;
      cpu::AttentionPasses passes;
      double bound;
    };
    for (const Variant& v : {Variant{"f32, one pass", DType::f32, cpu::AttentionPasses::one, kF32Bound},
                             Variant{"f32, two passes", DType::f32, cpu::AttentionPasses::two, kF32Bound},
                             Variant{"bf16", DType::bf16, cpu::AttentionPasses::by_threads, kBf16Bound}}) {
      SCOPED_TRACE(v.name);
      // Each rank's rows [2c, W]: its chunks r and 2C-1-r; its keys and values [2c, Wkv].
      std::vector<std::vector<float>> rows(C), kv(C), out(C), lse(C), dq(C), dkv(C);
      for (int r = 0; r < C; ++r) {
        rows[r].resize(2 * c * W), kv[r].resize(2 * c * Wkv), out[r].resize(2 * c * Cq), lse[r].resize(NH * 2 * c);
        dq[r].assign(2 * c * W, 0.0f), dkv[r].assign(2 * c * Wkv, 0.0f);
        for (int slot = 0; slot < 2; ++slot) {
          for (int t = 0; t < c; ++t) {
            const int at = ring_chunk(C, r, slot) * c + t, row = slot * c + t;
            for (int i = 0; i < W; ++i) rows[r][row * W + i] = qkv[at * W + i];
            for (int i = 0; i < Wkv; ++i) kv[r][row * Wkv + i] = qkv[at * W + Cq + i];
          }
        }
      }
      std::vector<float> block_out(c * Cq), block_lse(NH * c);
      const size_t lse_ld = 2 * c;
      // Rank r's query chunk b.q against rank `from`'s key chunk b.k.
      auto block = [&](int r, int from, const RingBlock& b) {
        return AttentionBlock{rows[r].data() + b.q * c * W,
                              static_cast<size_t>(W),
                              kv[from].data() + b.k * c * Wkv,
                              static_cast<size_t>(Wkv),
                              c,
                              NH,
                              KVH,
                              hs,
                              b.diagonal,
                              lse_ld};
      };
      for (int r = 0; r < C; ++r) {
        for (int step = 0; step < C; ++step) {
          const int from = (r - step + C) % C;
          for (const RingBlock& b : ring_blocks(C, r, step)) {
            AttentionBlock a = block(r, from, b);
            float *o = out[r].data() + b.q * c * Cq, *l = lse[r].data() + b.q * c;
            if (b.diagonal) {
              cpu::attention_block_forward(o, l, a, v.products);
              continue;
            }
            a.lse_ld = c;
            cpu::attention_block_forward(block_out.data(), block_lse.data(), a, v.products);
            cpu::attention_merge(o, l, block_out.data(), block_lse.data(), c, NH, hs, lse_ld);
          }
        }
      }
      // The gradients need every rank's output first: its own dy rows.
      for (int r = 0; r < C; ++r) {
        std::vector<float> mine(2 * c * Cq);
        for (int slot = 0; slot < 2; ++slot) {
          for (int t = 0; t < c; ++t) {
            const int at = ring_chunk(C, r, slot) * c + t;
            for (int i = 0; i < Cq; ++i) mine[(slot * c + t) * Cq + i] = dy[at * Cq + i];
          }
        }
        for (int step = 0; step < C; ++step) {
          const int from = (r - step + C) % C;
          for (const RingBlock& b : ring_blocks(C, r, step)) {
            const AttentionBlock a = block(r, from, b);
            cpu::attention_block_backward(dq[r].data() + b.q * c * W, dkv[from].data() + b.k * c * Wkv, mine.data() + b.q * c * Cq,
                                          out[r].data() + b.q * c * Cq, lse[r].data() + b.q * c, a, v.products, v.passes);
          }
        }
      }
      const double bound = v.bound;
      double worst = 0, dworst = 0;
      for (int r = 0; r < C; ++r) {
        for (int slot = 0; slot < 2; ++slot) {
          for (int t = 0; t < c; ++t) {
            const int at = ring_chunk(C, r, slot) * c + t, row = slot * c + t;
            for (int i = 0; i < Cq; ++i) {
              const double e = std::abs(out[r][row * Cq + i] - want[at * Cq + i]);
              worst = std::max(worst, e);
              ASSERT_LT(e, bound) << "out, position " << at << " column " << i << " (rank " << r << ")";
            }
            for (int i = 0; i < Cq; ++i) {
              const double e = std::abs(dq[r][row * W + i] - dwant[at * W + i]);
              dworst = std::max(dworst, e);
              ASSERT_LT(e, bound) << "dq, position " << at << " column " << i << " (rank " << r << ")";
            }
            for (int i = 0; i < Wkv; ++i) {
              const double e = std::abs(dkv[r][row * Wkv + i] - dwant[at * W + Cq + i]);
              dworst = std::max(dworst, e);
              ASSERT_LT(e, bound) << (i < Wkv / 2 ? "dk" : "dv") << ", position " << at << " column " << i % (Wkv / 2) << " (rank "
                                  << r << ")";
            }
          }
        }
      }
      std::printf("C %d, chunks of %d, %s: worst error of out %.3g, of a gradient %.3g (bound %.3g)\n", C, c, v.name, worst, dworst,
                  bound);
    }
  }
}

// The ring's schedule against the causal attention it computes: over every rank and step, each
// pair of chunks (query chunk i, key chunk j <= i) is met exactly once, diagonal where i = j, and
// never a pair the mask hides; and the zigzag split's point, each rank's query-key products (a
// diagonal block's c (c + 1) / 2, a whole one's c^2) within 10% of every other's. C contiguous
// pieces instead (rank r holding chunks 2r and 2r + 1) would give rank C-1 about 4C - 1 times rank
// 0's: the contrast shows the count can fail.
TEST(RingBlocks, ZigzagGivesEveryRankTheSameWork) {
  const double c = 64;
  for (int C : {2, 3, 4, 8}) {
    SCOPED_TRACE("C " + std::to_string(C));
    std::vector<std::vector<int>> met(2 * C, std::vector<int>(2 * C, 0));
    std::vector<double> work(C, 0.0);
    for (int r = 0; r < C; ++r) {
      for (int step = 0; step < C; ++step) {
        const int from = (r - step + C) % C;
        for (const RingBlock& b : ring_blocks(C, r, step)) {
          const int i = ring_chunk(C, r, b.q), j = ring_chunk(C, from, b.k);
          ASSERT_LE(j, i) << "rank " << r << " step " << step << " meets keys after its queries";
          EXPECT_EQ(b.diagonal, i == j) << "chunks " << i << ", " << j;
          ++met[i][j];
          work[r] += b.diagonal ? c * (c + 1) / 2 : c * c;
        }
      }
    }
    for (int i = 0; i < 2 * C; ++i) {
      for (int j = 0; j <= i; ++j) EXPECT_EQ(met[i][j], 1) << "query chunk " << i << ", key chunk " << j;
    }
    const auto [lo, hi] = std::minmax_element(work.begin(), work.end());
    EXPECT_LE(*hi, 1.1 * *lo);
    // Contiguous: rank r's chunks 2r and 2r + 1 meet 2r + 1 and 2r + 2 chunks of keys, the last one
    // each diagonal.
    std::vector<double> contiguous(C, 0.0);
    for (int r = 0; r < C; ++r) contiguous[r] = (4.0 * r + 1) * c * c + 2 * c * (c + 1) / 2;
    EXPECT_GT(contiguous[C - 1], 1.1 * contiguous[0]);
  }
}

}  // namespace
}  // namespace zeroth::gpt
