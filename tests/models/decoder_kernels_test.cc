// The Llama family's kernels (RMSNorm, rotary embedding, SwiGLU, grouped-query attention) and the
// mixture-of-experts row moves (dispatch to experts, weighted combine, both backwards), every
// device, against float64 references computed here from their definitions (Zhang and Sennrich's
// RMSNorm; RoFormer's rotation in Hugging Face's rotate-half layout; Shazeer's SwiGLU; GQA as
// Ainslie et al. define it: key/value head j serves query heads j g .. j g + g - 1), each element
// within the f32 error bound of the sums that make it (u = 2^-24 times the sum of |terms|). The
// attention's generation form (the last rows of a sequence over a key/value cache) against the
// same definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "models/kernels/kernels.h"
#include "models/moe/router.h"
#include "tests/models/model_test_util.h"
#include "tests/test_util.h"

namespace zeroth {
namespace {

using testing::OnDevice;
using testing::random_vec;
using testing::Vec;
using D = std::vector<double>;

constexpr double kU = 0x1.0p-24;

// |got - want| <= bound per element; prints the worst ratio.
void expect_within(const std::string &what, const Vec &got, const D &want, const D &bound) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    worst = std::max(worst, err / std::max(bound[i], 1e-300));
    ASSERT_LE(err, bound[i]) << what << "[" << i << "]: " << got[i] << " against " << want[i];
  }
  std::printf("%s: worst error %.3f of its bound\n", what.c_str(), worst);
}

class DecoderKernels : public testing::DeviceTest {};

// Per-head norms read heads inside wider rows: N rows of `ld` floats hold `groups` heads of C
// channels and then padding, which stays as it was.
TEST_P(DecoderKernels, RmsNormMatchesItsDefinition) {
  struct Shape {
    int N, groups, C, ld;
  };
  std::mt19937 rng(11);
  for (const Shape sh : {Shape{9, 1, 40, 40}, Shape{6, 3, 16, 3 * 16 + 5}}) {
    SCOPED_TRACE("groups " + std::to_string(sh.groups));
    const size_t rows = static_cast<size_t>(sh.N) * sh.groups, total = static_cast<size_t>(sh.N) * sh.ld;
    const float eps = 1e-6f;
    const Vec x = random_vec(total, rng, 2.0f), w = random_vec(sh.C, rng), dy = random_vec(total, rng), dx0 = random_vec(total, rng);
    D y(total), yb(total), dx(total), dxb(total), dw(sh.C, 0.0), dwb(sh.C, 0.0);
    for (size_t i = 0; i < total; ++i) y[i] = x[i], dx[i] = dx0[i];  // padding: unchanged
    for (size_t r = 0; r < rows; ++r) {
      const size_t at = r / sh.groups * sh.ld + r % sh.groups * sh.C;
      double ss = 0, dot = 0, dota = 0;
      for (int c = 0; c < sh.C; ++c) ss += double(x[at + c]) * x[at + c];
      const double rs = 1.0 / std::sqrt(ss / sh.C + eps);
      for (int c = 0; c < sh.C; ++c) {
        dot += double(w[c]) * dy[at + c] * x[at + c];
        dota += std::abs(double(w[c]) * dy[at + c] * x[at + c]);
      }
      for (int c = 0; c < sh.C; ++c) {
        const double xv = x[at + c], g = double(w[c]) * dy[at + c];
        y[at + c] = xv * rs * w[c];
        // rstd carries the C-term sum of squares' error (relative C u / 2) and a few roundings.
        yb[at + c] = (sh.C / 2.0 + 6) * kU * std::abs(y[at + c]);
        dx[at + c] = dx0[at + c] + rs * (g - xv * rs * rs * dot / sh.C);
        dxb[at + c] = (sh.C + 10) * kU * (std::abs(rs * g) + std::abs(xv) * rs * rs * rs * dota / sh.C) + kU * std::abs(dx[at + c]);
        dw[c] += double(dy[at + c]) * xv * rs;
        dwb[c] += (sh.C / 2.0 + rows + 6) * kU * std::abs(double(dy[at + c]) * xv * rs);
      }
    }
    OnDevice d{*device_, {}};
    float *px = d.put(x), *pw = d.put(w), *pdy = d.put(dy), *pdx = d.put(dx0), *py = d.put(x), *prstd = d.zeros(rows),
          *pdw = d.zeros(sh.C);
    auto k = gpt::make_kernels(device_->default_stream());
    k->submit([&] {
      k->rmsnorm_forward(py, prstd, px, pw, sh.N, sh.groups, sh.C, sh.ld, eps);
      k->rmsnorm_backward(pdx, pdw, pdy, px, pw, prstd, sh.N, sh.groups, sh.C, sh.ld, true);
    });
    expect_within("rmsnorm out", d.get(py, total), y, yb);
    expect_within("rmsnorm dinp (added)", d.get(pdx, total), dx, dxb);
    expect_within("rmsnorm dweight", d.get(pdw, sh.C), dw, dwb);
  }
}

// In rows of (NH + 2 KVH) heads, the first NH + KVH (queries and keys) turn by their position's
// angles, the values stay bit for bit; the inverse turns back by the transpose.
TEST_P(DecoderKernels, RotaryEmbeddingRotatesHalvesAsHuggingFaceDoes) {
  const int B = 2, T = 7, NH = 4, KVH = 2, hs = 16, half = hs / 2, W = (NH + 2 * KVH) * hs, rotated = NH + KVH;
  const size_t N = static_cast<size_t>(B) * T;
  std::mt19937 rng(12);
  Vec table(static_cast<size_t>(T) * hs);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      const double angle = t * std::pow(10000.0, -2.0 * i / hs);
      table[t * hs + i] = static_cast<float>(std::cos(angle));
      table[t * hs + half + i] = static_cast<float>(std::sin(angle));
    }
  }
  const Vec x = random_vec(N * W, rng);
  for (const bool inverse : {false, true}) {
    SCOPED_TRACE(inverse ? "inverse" : "forward");
    const double sign = inverse ? -1.0 : 1.0;
    D want(x.begin(), x.end()), bound(N * W, 0.0);
    for (size_t n = 0; n < N; ++n) {
      const float *cs = table.data() + (n % T) * hs;
      for (int h = 0; h < rotated; ++h) {
        for (int i = 0; i < half; ++i) {
          const size_t at = n * W + h * hs + i;
          const double a = x[at], b = x[at + half], c = cs[i], s = sign * cs[half + i];
          want[at] = a * c - b * s;
          want[at + half] = b * c + a * s;
          bound[at] = 3 * kU * (std::abs(a * c) + std::abs(b * s));
          bound[at + half] = 3 * kU * (std::abs(b * c) + std::abs(a * s));
        }
      }
    }
    OnDevice d{*device_, {}};
    float *px = d.put(x), *ptable = d.put(table);
    auto k = gpt::make_kernels(device_->default_stream());
    k->submit([&] { k->rope(px, ptable, N, T, W, rotated, hs, inverse); });
    const Vec got = d.get(px, N * W);
    expect_within("rope", got, want, bound);
    for (size_t n = 0; n < N; ++n) {
      for (int c = rotated * hs; c < W; ++c) ASSERT_EQ(got[n * W + c], x[n * W + c]) << "a value head moved";
    }
  }
}

TEST_P(DecoderKernels, SwiGluMatchesItsDefinition) {
  const size_t N = 13;
  const int F = 37;
  std::mt19937 rng(13);
  const Vec in = random_vec(N * 2 * F, rng, 3.0f), dy = random_vec(N * F, rng);
  D y(N * F), yb(N * F), din(N * 2 * F), dinb(N * 2 * F);
  for (size_t n = 0; n < N; ++n) {
    for (int j = 0; j < F; ++j) {
      const double g = in[n * 2 * F + j], u = in[n * 2 * F + F + j], sig = 1.0 / (1.0 + std::exp(-g)), dv = dy[n * F + j];
      y[n * F + j] = g * sig * u;
      // The sigmoid's exp is good to a few ulp; a handful of roundings follow.
      yb[n * F + j] = 16 * kU * std::abs(g * sig * u);
      din[n * 2 * F + j] = dv * u * sig * (1.0 + g * (1.0 - sig));
      dinb[n * 2 * F + j] = 16 * kU * std::abs(dv * u) * sig * (1.0 + std::abs(g) * (1.0 - sig));
      din[n * 2 * F + F + j] = dv * g * sig;
      dinb[n * 2 * F + F + j] = 16 * kU * std::abs(dv * g * sig);
    }
  }
  OnDevice d{*device_, {}};
  float *pin = d.put(in), *pdy = d.put(dy), *py = d.zeros(N * F), *pdin = d.zeros(N * 2 * F);
  auto k = gpt::make_kernels(device_->default_stream());
  k->submit([&] {
    k->swiglu_forward(py, pin, N, F);
    k->swiglu_backward(pdin, pin, pdy, N, F);
  });
  expect_within("swiglu out", d.get(py, N * F), y, yb);
  expect_within("swiglu dinp", d.get(pdin, N * 2 * F), din, dinb);
}

// Causal attention with NH query heads over KVH key/value heads, forward and backward, against the
// float64 definition. Bounds: each output's f32 error is that of its sums (k terms: hs for a
// score, T for a softmax-weighted sum) over the sum of |terms|, plus what the scores' own error
// does through the softmax (a score off by e moves each probability by at most 2 e of itself).
// Lengths that fall inside one block of the CPU's blocked attention (1, 7, 9), fill it (64), and
// span three chunks of keys with a one-row block at the end (513, at the models' head size); one
// with scores in the hundreds, so a chunk's max may jump past what exp can take unshifted. Outputs
// start as garbage, and the kept buffers are the size the device's kernels keep.
// A block of columns between matrices of other leading dimensions, copied and added (Ulysses'
// exchanges pack and unpack heads with it): exactly the definition's values, and nothing outside
// the block touched.
TEST_P(DecoderKernels, CopyColumnsMovesExactlyTheBlock) {
  const size_t rows = 7, cols = 5, lds = 13, ldd = 9;
  std::mt19937 rng(17);
  const Vec src = random_vec(rows * lds, rng), dst0 = random_vec(rows * ldd, rng);
  OnDevice d{*device_, {}};
  float *ps = d.put(src), *pcopy = d.put(dst0), *padd = d.put(dst0);
  auto k = gpt::make_kernels(device_->default_stream());
  k->submit([&] {
    k->copy_columns(pcopy + 2, ldd, ps + 3, lds, rows, cols, false);
    k->copy_columns(padd + 2, ldd, ps + 3, lds, rows, cols, true);
  });
  const Vec copied = d.get(pcopy, rows * ldd), added = d.get(padd, rows * ldd);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < ldd; ++c) {
      const size_t i = r * ldd + c;
      const bool in = c >= 2 && c < 2 + cols;
      const float from = in ? src[r * lds + 3 + (c - 2)] : 0.0f;
      EXPECT_EQ(copied[i], in ? from : dst0[i]) << "copy, row " << r << " column " << c;
      EXPECT_EQ(added[i], in ? dst0[i] + from : dst0[i]) << "add, row " << r << " column " << c;
    }
  }
}

TEST_P(DecoderKernels, GroupedQueryAttentionMatchesItsDefinition) {
  struct Shape {
    int T, NH, KVH, hs;
    float spread;  // of q, k and v
  };
  const int B = 2;
  const bool probabilities = gpt::attention_keeps_probabilities(device_->kind());
  for (const auto &[T, NH, KVH, hs, spread] :
       {Shape{9, 4, 4, 8, 1}, Shape{9, 4, 2, 8, 1}, Shape{9, 6, 2, 8, 1}, Shape{9, 4, 1, 8, 1}, Shape{1, 4, 2, 8, 1},
        Shape{7, 6, 3, 16, 1}, Shape{64, 4, 2, 8, 1}, Shape{70, 3, 1, 24, 1}, Shape{513, 4, 2, 64, 1}, Shape{300, 2, 1, 16, 8}}) {
    SCOPED_TRACE(std::to_string(NH) + " query heads over " + std::to_string(KVH) + ", T " + std::to_string(T) + ", spread " +
                 std::to_string(spread));
    const int g = NH / KVH, W = (NH + 2 * KVH) * hs, Cq = NH * hs;
    const size_t TT = static_cast<size_t>(T) * T;
    std::mt19937 rng(14 + NH * 10 + KVH);
    const Vec qkv = random_vec(static_cast<size_t>(B) * T * W, rng, spread), dy = random_vec(static_cast<size_t>(B) * T * Cq, rng);
    const double scale = 1.0 / std::sqrt(double(hs));
    D out(B * T * Cq), outa(B * T * Cq), dqkv(B * T * W, 0.0), dqkva(B * T * W, 0.0);
    // f32 keeps no probability below its normal range (~e^-87, under kTiny): each may be off by
    // kTiny absolutely, which the gradients carry with the terms' other factors (dtiny).
    const double kTiny = 0x1.0p-125;
    D dtiny(B * T * W, 0.0);
    std::vector<double> err_s(static_cast<size_t>(B) * NH * T);  // per query row: its scores' f32 error bound
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        auto q = [&](int t, int i) { return double(qkv[(static_cast<size_t>(b) * T + t) * W + h * hs + i]); };
        auto kk = [&](int t, int i) { return double(qkv[(static_cast<size_t>(b) * T + t) * W + (NH + h / g) * hs + i]); };
        auto v = [&](int t, int i) { return double(qkv[(static_cast<size_t>(b) * T + t) * W + (NH + KVH + h / g) * hs + i]); };
        D P(TT, 0.0), dP(TT, 0.0), dPa(TT, 0.0), dS(TT, 0.0), dSa(TT, 0.0);
        for (int t = 0; t < T; ++t) {
          double m = -1e300, es = 0;
          D s(T);
          for (int j = 0; j <= t; ++j) {
            double dot = 0, dota = 0;
            for (int i = 0; i < hs; ++i) dot += q(t, i) * kk(j, i), dota += std::abs(q(t, i) * kk(j, i));
            s[j] = dot * scale;
            es = std::max(es, (hs + 3) * kU * dota * scale);
            m = std::max(m, s[j]);
          }
          err_s[(static_cast<size_t>(b) * NH + h) * T + t] = es;
          double z = 0;
          for (int j = 0; j <= t; ++j) z += std::exp(s[j] - m);
          for (int j = 0; j <= t; ++j) P[t * T + j] = std::exp(s[j] - m) / z;
          // The probabilities' error: the scores' through the softmax, and the softmax's own roundings.
          const double ep = 2 * es + (T + 8) * kU;
          for (int i = 0; i < hs; ++i) {
            double o = 0, oa = 0;
            for (int j = 0; j <= t; ++j) o += P[t * T + j] * v(j, i), oa += P[t * T + j] * std::abs(v(j, i));
            const size_t at = (static_cast<size_t>(b) * T + t) * Cq + h * hs + i;
            out[at] = o;
            outa[at] = (T + 2) * kU * oa + ep * oa;
          }
        }
        // Backward: dP = dy v^T, dS = P (dP - <P, dP>) scale, dq = dS k, dk = dS^T q, dv = P^T dy.
        for (int t = 0; t < T; ++t) {
          auto dyv = [&](int i) { return double(dy[(static_cast<size_t>(b) * T + t) * Cq + h * hs + i]); };
          double row = 0, rowa = 0;
          for (int j = 0; j <= t; ++j) {
            double s = 0, a = 0;
            for (int i = 0; i < hs; ++i) s += dyv(i) * v(j, i), a += std::abs(dyv(i) * v(j, i));
            dP[t * T + j] = s, dPa[t * T + j] = a;
            row += P[t * T + j] * s, rowa += P[t * T + j] * a;
          }
          for (int j = 0; j <= t; ++j) {
            dS[t * T + j] = P[t * T + j] * (dP[t * T + j] - row) * scale;
            dSa[t * T + j] = P[t * T + j] * (dPa[t * T + j] + rowa) * scale;
            dPa[t * T + j] = (dPa[t * T + j] + rowa) * scale;  // from here on: dS's factor beside P
          }
          for (int j = 0; j <= t; ++j) {
            for (int i = 0; i < hs; ++i) {
              const size_t kat = (static_cast<size_t>(b) * T + j) * W + (NH + h / g) * hs + i;
              const size_t vat = (static_cast<size_t>(b) * T + j) * W + (NH + KVH + h / g) * hs + i;
              dqkv[kat] += dS[t * T + j] * q(t, i), dqkva[kat] += dSa[t * T + j] * std::abs(q(t, i));
              dqkv[vat] += P[t * T + j] * dyv(i), dqkva[vat] += P[t * T + j] * std::abs(dyv(i));
              dtiny[kat] += kTiny * dPa[t * T + j] * std::abs(q(t, i)), dtiny[vat] += kTiny * std::abs(dyv(i));
            }
          }
          for (int i = 0; i < hs; ++i) {
            double s = 0, a = 0;
            double tiny = 0;
            for (int j = 0; j <= t; ++j) {
              s += dS[t * T + j] * kk(j, i), a += dSa[t * T + j] * std::abs(kk(j, i));
              tiny += kTiny * dPa[t * T + j] * std::abs(kk(j, i));
            }
            const size_t at = (static_cast<size_t>(b) * T + t) * W + h * hs + i;
            dqkv[at] = s, dqkva[at] = a, dtiny[at] = tiny;
          }
        }
      }
    }
    // Every gradient passes through scores and probabilities: the largest score error of the
    // batch row bounds what it does to them (relative, as for the output).
    double es_max = 0;
    for (double e : err_s) es_max = std::max(es_max, e);
    D dqkvb(dqkv.size());
    for (size_t i = 0; i < dqkv.size(); ++i)
      dqkvb[i] = ((2 * T + hs + 16) * kU + 4 * es_max) * dqkva[i] + kU * std::abs(dqkv[i]) + dtiny[i];
    D outb(out.size());
    for (size_t i = 0; i < out.size(); ++i) outb[i] = outa[i] + kU * std::abs(out[i]);
    OnDevice d{*device_, {}};
    const size_t kept = static_cast<size_t>(B) * NH * (probabilities ? TT : T);
    // Outputs are overwritten, whatever they held.
    float *pqkv = d.put(qkv), *pdy = d.put(dy), *pout = d.put(random_vec(out.size(), rng)), *patt = d.zeros(kept),
          *pdatt = probabilities ? d.zeros(kept) : nullptr, *pdqkv = d.put(random_vec(dqkv.size(), rng));
    auto k = gpt::make_kernels(device_->default_stream());
    k->submit([&] {
      k->attention_forward(pout, patt, pqkv, B, T, NH, KVH, hs, DType::f32);
      k->attention_backward(pdqkv, pdatt, pdy, pout, pqkv, patt, B, T, NH, KVH, hs, DType::f32);
    });
    expect_within("attention out", d.get(pout, out.size()), out, outb);
    expect_within("attention dqkv", d.get(pdqkv, dqkv.size()), dqkv, dqkvb);
    // Generation's form: the last T - pos rows of batch row 1 over its first T rows (a key/value
    // cache holding positions [0, pos)) are those rows of the definition.
    for (const int pos : {0, T / 3, T - 1}) {
      const int n = T - pos;
      float *prows = d.put(random_vec(static_cast<size_t>(n) * Cq, rng)),
            *patt_rows = d.zeros(static_cast<size_t>(NH) * n * (probabilities ? T : 1));
      k->submit([&] { k->attention_rows(prows, patt_rows, pqkv + static_cast<size_t>(T) * W, pos, n, NH, KVH, hs); });
      const size_t first = (static_cast<size_t>(T) + pos) * Cq, count = static_cast<size_t>(n) * Cq;
      expect_within("attention rows from " + std::to_string(pos), d.get(prows, count),
                    D(out.begin() + first, out.begin() + first + count), D(outb.begin() + first, outb.begin() + first + count));
    }
  }
}

// A routing with dropped choices (capacity below the tokens' share) and a token with no kept choice.
TEST_P(DecoderKernels, MixtureOfExpertsRowsMoveAsTheirDefinitionSays) {
  const size_t N = 23;
  const int E = 4, k = 2, C = 37;
  std::mt19937 rng(17);
  gpt::MoeGate gate;
  gate.experts = E;
  gate.top_k = k;
  const Vec logits = random_vec(N * E, rng, 2.0f);
  Vec probs(N * E);
  const gpt::Routing r = gpt::moe_route(gate, logits.data(), probs.data(), N, 5);
  size_t unrouted = 0;  // tokens whose every choice was dropped: combine gives them 0
  for (size_t n = 0; n < N; ++n) unrouted += r.row[n * k] < 0 && r.row[n * k + 1] < 0;
  ASSERT_GT(r.dropped, 0u);
  ASSERT_GT(unrouted, 0u);
  const size_t R = r.rows();
  const Vec x = random_vec(N * C, rng), rows = random_vec(R * C, rng), dy = random_vec(N * C, rng), drows = random_vec(R * C, rng),
            dx0 = random_vec(N * C, rng);
  D out(R * C), y(N * C), yb(N * C), dx(N * C), dxb(N * C), dr(R * C), drb(R * C), dw(N * k), dwb(N * k);
  for (size_t i = 0; i < R; ++i) {
    for (int c = 0; c < C; ++c) out[i * C + c] = x[r.row_token[i] * C + c];
  }
  for (size_t n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) {
      double sum = 0, mag = 0, back = dx0[n * C + c], back_mag = std::abs(dx0[n * C + c]);
      for (int j = 0; j < k; ++j) {
        const int32_t row = r.row[n * k + j];
        if (row < 0) continue;
        const double term = static_cast<double>(r.weight[n * k + j]) * rows[row * C + c];
        sum += term, mag += std::abs(term);
        back += drows[row * C + c], back_mag += std::abs(drows[row * C + c]);
        dr[row * C + c] = static_cast<double>(r.weight[n * k + j]) * dy[n * C + c];
        drb[row * C + c] = kU * std::abs(dr[row * C + c]);
      }
      y[n * C + c] = sum, yb[n * C + c] = (k + 2) * kU * mag;
      dx[n * C + c] = back, dxb[n * C + c] = (k + 2) * kU * back_mag;
    }
    for (int j = 0; j < k; ++j) {
      const int32_t row = r.row[n * k + j];
      if (row < 0) continue;
      double dot = 0, mag = 0;
      for (int c = 0; c < C; ++c)
        dot += static_cast<double>(dy[n * C + c]) * rows[row * C + c], mag += std::abs(dy[n * C + c] * rows[row * C + c]);
      dw[n * k + j] = dot, dwb[n * k + j] = (C + 2) * kU * mag;
    }
  }
  OnDevice d{*device_, {}};
  auto put_ints = [&](const std::vector<int32_t> &v) {
    d.held.push_back(device_->allocate(std::max<size_t>(v.size(), 1) * sizeof(int32_t), MemTag::other));
    device_->copy(device_->default_stream(), d.held.back().data(), v.data(), v.size() * sizeof(int32_t));
    device_->default_stream().synchronize();
    return d.held.back().as<int32_t>();
  };
  const int32_t *prow = put_ints(r.row), *ptoken = put_ints(r.row_token);
  float *px = d.put(x), *prows = d.put(rows), *pdy = d.put(dy), *pdrows_in = d.put(drows), *pw = d.put(r.weight);
  float *pout = d.zeros(R * C), *py = d.put(Vec(N * C, 5.0f)), *pdx = d.put(dx0), *pdr = d.zeros(R * C),
        *pdw = d.put(Vec(N * k, 5.0f));
  auto kern = gpt::make_kernels(device_->default_stream());
  kern->submit([&] {
    kern->moe_dispatch(pout, px, ptoken, R, C);
    kern->moe_combine(py, prows, prow, pw, N, k, C);
    kern->moe_dispatch_backward(pdx, pdrows_in, prow, N, k, C);
    kern->moe_combine_backward(pdr, pdw, pdy, prows, prow, pw, N, k, C);
  });
  const Vec dispatched = d.get(pout, R * C);
  ASSERT_EQ(dispatched, Vec(out.begin(), out.end())) << "dispatch copies rows exactly";
  expect_within("moe combine", d.get(py, N * C), y, yb);
  expect_within("moe dispatch backward", d.get(pdx, N * C), dx, dxb);
  expect_within("moe combine backward rows", d.get(pdr, R * C), dr, drb);
  expect_within("moe combine backward weights", d.get(pdw, N * k), dw, dwb);
}

INSTANTIATE_TEST_SUITE_P(Devices, DecoderKernels, ::testing::ValuesIn(testing::device_specs()));

}  // namespace
}  // namespace zeroth
