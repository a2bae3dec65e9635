// A bf16 run's attention on the CPU (row_kernels.h: products on bf16 operands, f32 accumulation)
// against float64 that rounds to bf16 at the same points: queries, keys, values and the output
// gradient before every product; each chunk's probabilities, exp(s - the running max) over keys in
// chunks of 128 as the online softmax makes them, before P V; the recomputed probabilities before
// P^T dY; the scores' gradient before dS K and dS^T Q. The rounding itself is this file's own (to 8
// significant bits by frexp and nearbyint), not the kernels'.
//
// What is left is f32 arithmetic, bounded as decoder_kernels_test.cc bounds the f32 attention, plus
// the rare bf16 rounding that f32's error tips to the other neighbour (a flip: 2^-8 of one term).
// Each element may hold up to kFlips of its largest term; and few may need any (kFlipShare): an
// operand left unrounded, or rounded at another point, moves most elements past the f32 bound.
#include <gtest/gtest.h>

#include <algorithm>  // std::max
#include <cmath>      // std::abs, std::exp, std::log, std::sqrt, std::ldexp, std::frexp, std::nearbyint
#include <cstdio>     // std::printf
#include <cstring>    // std::memcmp
#include <random>     // std::mt19937
#include <string>     // std::string, std::to_string
#include <vector>     // std::vector

#include "core/cpu/kernels.h"  // cpu::num_threads, cpu::set_num_threads
#include "models/kernels/cpu/row_kernels.h"

namespace zeroth::gpt::cpu {
namespace {

using Vec = std::vector<float>;
using D = std::vector<double>;
const double kU = std::ldexp(1.0, -24), kUb = std::ldexp(1.0, -8);  // f32's and bf16's unit roundoff
constexpr int kChunk = 128;                                         // keys a chunk of the online softmax
constexpr double kFlips = 2, kFlipShare = 0.002;

double bf16(double x) {
  if (x == 0) return x;
  int e = 0;
  const double m = std::frexp(static_cast<double>(static_cast<float>(x)), &e);
  return std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8);
}

Vec random_vec(size_t n, std::mt19937& rng, float spread) {
  std::uniform_real_distribution<float> u(-spread, spread);
  Vec v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// What an output element must meet: the float64 value, the f32 bound, its largest term.
struct Want {
  D value, f32, largest;
  explicit Want(size_t n) : value(n, 0.0), f32(n, 0.0), largest(n, 0.0) {}
};

// Counts against `want`; fails an element past its f32 bound plus kFlips of its largest term.
struct Tally {
  size_t elements = 0, flipped = 0;
  double worst = 0;
  void check(const char* what, const Vec& got, const Want& want) {
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::abs(got[i] - want.value[i]), flip = kFlips * kUb * want.largest[i];
      ASSERT_LE(err, want.f32[i] + flip) << what << " at " << i << ": " << got[i] << " against " << want.value[i];
      ++elements;
      flipped += err > want.f32[i];
      worst = std::max(worst, err / (want.f32[i] + flip));
    }
  }
};

TEST(Bf16Attention, MatchesFloat64RoundedWhereTheKernelRounds) {
  struct Shape {
    int T, NH, KVH, hs;
  };
  const int B = 2;
  Tally tally;
  for (const auto& [T, NH, KVH, hs] :
       {Shape{1, 4, 2, 8}, Shape{7, 6, 3, 16}, Shape{70, 2, 2, 16}, Shape{64, 4, 2, 64}, Shape{200, 2, 1, 32}, Shape{513, 2, 1, 64}}) {
    SCOPED_TRACE(std::to_string(NH) + " query heads over " + std::to_string(KVH) + ", T " + std::to_string(T) + ", hs " +
                 std::to_string(hs));
    const int g = NH / KVH, W = (NH + 2 * KVH) * hs, Cq = NH * hs;
    std::mt19937 rng(41 + T);
    const Vec qkv = random_vec(static_cast<size_t>(B) * T * W, rng, 1), dy = random_vec(static_cast<size_t>(B) * T * Cq, rng, 1);
    Vec out(static_cast<size_t>(B) * T * Cq), lse(static_cast<size_t>(B) * NH * T);
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, KVH, hs, DType::bf16);
    Vec dqkv[2];
    int split = 0;
    for (const AttentionPasses passes : {AttentionPasses::one, AttentionPasses::two}) {
      dqkv[split].assign(qkv.size(), 7.0f);
      attention_backward(dqkv[split++].data(), dy.data(), out.data(), qkv.data(), lse.data(), B, T, NH, KVH, hs, DType::bf16, passes);
    }
    ASSERT_EQ(std::memcmp(dqkv[0].data(), dqkv[1].data(), qkv.size() * sizeof(float)), 0) << "the two passes differ";

    const double scale = 1.0 / std::sqrt(double(hs));
    Want o(out.size()), d(qkv.size());
    double es_max = 0;
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        const size_t row0 = static_cast<size_t>(b) * T;
        auto at = [&](int t, int head, int i) { return (row0 + t) * W + static_cast<size_t>(head) * hs + i; };
        auto q = [&](int t, int i) { return bf16(qkv[at(t, h, i)]); };
        auto k = [&](int t, int i) { return bf16(qkv[at(t, NH + h / g, i)]); };
        auto v = [&](int t, int i) { return bf16(qkv[at(t, NH + KVH + h / g, i)]); };
        auto y_at = [&](int t, int i) { return (row0 + t) * Cq + static_cast<size_t>(h) * hs + i; };
        for (int t = 0; t < T; ++t) {
          D s(t + 1), p(t + 1);
          double es = 0;
          for (int j = 0; j <= t; ++j) {
            double dot = 0, mag = 0;
            for (int i = 0; i < hs; ++i) dot += q(t, i) * k(j, i), mag += std::abs(q(t, i) * k(j, i));
            s[j] = dot * scale;
            es = std::max(es, (hs + 3) * kU * mag * scale);
          }
          es_max = std::max(es_max, es);
          // Forward, chunk by chunk: the running max, the chunk's rounded exps, the sum so far rescaled.
          double m = -1e300;
          D acc(hs, 0.0), acc_mag(hs, 0.0), largest(hs, 0.0);
          for (int c0 = 0; c0 <= t; c0 += kChunk) {
            const int c1 = std::min(t + 1, c0 + kChunk);
            double mc = m;
            for (int j = c0; j < c1; ++j) mc = std::max(mc, s[j]);
            const double alpha = std::exp(m - mc);
            for (int i = 0; i < hs; ++i) acc[i] *= alpha, acc_mag[i] *= alpha, largest[i] *= alpha;
            for (int j = c0; j < c1; ++j) {
              const double e = bf16(std::exp(s[j] - mc));
              for (int i = 0; i < hs; ++i) {
                acc[i] += e * v(j, i), acc_mag[i] += e * std::abs(v(j, i));
                largest[i] = std::max(largest[i], e * std::abs(v(j, i)));
              }
            }
            m = mc;
          }
          double l = 0;
          for (int j = 0; j <= t; ++j) l += std::exp(s[j] - m);
          const double row_lse = m + std::log(l), ep = 2 * es + (t + 9) * kU;
          for (int j = 0; j <= t; ++j) p[j] = std::exp(s[j] - row_lse);
          for (int i = 0; i < hs; ++i) {
            const size_t y = y_at(t, i);
            o.value[y] = acc[i] / l;
            o.f32[y] = ((t + 3) * kU + ep) * acc_mag[i] / l + kU * std::abs(o.value[y]);
            o.largest[y] = largest[i] / l;
          }
          // Backward: dP = dY V^T on rounded operands; d = dY . Y on the given dY and the kernel's Y;
          // dS = P (dP - d) scale, rounded for dS K and dS^T Q; P rounded for P^T dY.
          double dd = 0, dd_mag = 0;
          for (int i = 0; i < hs; ++i)
            dd += double(dy[y_at(t, i)]) * out[y_at(t, i)], dd_mag += std::abs(double(dy[y_at(t, i)]) * out[y_at(t, i)]);
          auto dyr = [&](int i) { return bf16(dy[y_at(t, i)]); };
          for (int j = 0; j <= t; ++j) {
            double dp = 0, dp_mag = 0;
            for (int i = 0; i < hs; ++i) dp += dyr(i) * v(j, i), dp_mag += std::abs(dyr(i) * v(j, i));
            const double ds = p[j] * (dp - dd) * scale, ds_mag = p[j] * (dp_mag + dd_mag) * scale, pr = bf16(p[j]), dsr = bf16(ds);
            for (int i = 0; i < hs; ++i) {
              const size_t qa = at(t, h, i), ka = at(j, NH + h / g, i), va = at(j, NH + KVH + h / g, i);
              d.value[qa] += dsr * k(j, i), d.f32[qa] += ds_mag * std::abs(k(j, i));
              d.largest[qa] = std::max(d.largest[qa], std::abs(dsr * k(j, i)));
              d.value[ka] += dsr * q(t, i), d.f32[ka] += ds_mag * std::abs(q(t, i));
              d.largest[ka] = std::max(d.largest[ka], std::abs(dsr * q(t, i)));
              d.value[va] += pr * dyr(i), d.f32[va] += pr * std::abs(dyr(i));
              d.largest[va] = std::max(d.largest[va], std::abs(pr * dyr(i)));
            }
          }
        }
      }
    }
    // The f32 bounds of the gradients, from their terms' magnitudes as for f32 attention.
    for (size_t i = 0; i < d.f32.size(); ++i) d.f32[i] = ((2 * T + hs + 16) * kU + 4 * es_max) * d.f32[i] + kU * std::abs(d.value[i]);
    tally.check("out", out, o);
    tally.check("dqkv", dqkv[0], d);
  }
  const double share = static_cast<double>(tally.flipped) / static_cast<double>(tally.elements);
  std::printf("bf16 attention: %zu of %zu elements past the f32 bound (%.4f), worst %.3f of the bound with flips\n", tally.flipped,
              tally.elements, share, tally.worst);
  EXPECT_LE(share, kFlipShare)
      << "too many elements past the f32 bound: an operand rounded where the kernel does not, or not where it does";
}

// A bf16 forward over many key/value heads packs each head's pairs in the task that reads them;
// over few, it packs all heads first and splits the work by blocks of queries. Both must give the
// same bits: a batch of 16 or 32 key/value heads (four times what two threads need to pack by
// head, so a higher threshold still takes that way), against each of its sequences alone (one or
// two heads: the other way), at odd lengths so a last key pairs with zero.
TEST(Bf16Attention, ForwardPackingByHeadOrAllAtOnceGivesTheSameBits) {
  struct RestoreThreads {
    int threads = zeroth::cpu::num_threads();
    ~RestoreThreads() { zeroth::cpu::set_num_threads(threads); }
  } restore;
  zeroth::cpu::set_num_threads(2);
  struct Shape {
    int B, T, NH, KVH, hs;
  };
  for (const auto& [B, T, NH, KVH, hs] : {Shape{16, 131, 4, 2, 32}, Shape{16, 65, 3, 1, 16}, Shape{8, 200, 4, 2, 64}}) {
    SCOPED_TRACE(std::to_string(B) + " x " + std::to_string(T) + ", " + std::to_string(NH) + " heads over " + std::to_string(KVH));
    const size_t W = static_cast<size_t>(NH + 2 * KVH) * hs, Cq = static_cast<size_t>(NH) * hs;
    std::mt19937 rng(7 + T);
    const Vec qkv = random_vec(B * T * W, rng, 1);
    Vec out(B * T * Cq), lse(static_cast<size_t>(B) * NH * T);
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, KVH, hs, DType::bf16);
    for (int b = 0; b < B; ++b) {
      Vec one_out(T * Cq), one_lse(static_cast<size_t>(NH) * T);
      attention_forward(one_out.data(), one_lse.data(), qkv.data() + b * T * W, 1, T, NH, KVH, hs, DType::bf16);
      EXPECT_EQ(std::memcmp(one_out.data(), out.data() + b * T * Cq, one_out.size() * sizeof(float)), 0) << "out of sequence " << b;
      EXPECT_EQ(std::memcmp(one_lse.data(), lse.data() + b * NH * T, one_lse.size() * sizeof(float)), 0) << "lse of sequence " << b;
    }
  }
}

}  // namespace
}  // namespace zeroth::gpt::cpu
