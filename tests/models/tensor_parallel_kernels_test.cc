// Megatron's tensor-parallel pieces on the GPT's kernels, every device, against float64 references
// computed here: a column-parallel linear followed by a row-parallel one equals the unsplit pair
// (forward and backward) once the ranks' partial sums are added, with the slices cut by
// TensorSplit as the model cuts its parameters; the vocabulary-parallel cross-entropy equals the
// full one (loss and every logit's gradient) for vocabularies that tp does not divide.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "models/block_api.h"
#include "models/kernels/kernels.h"
#include "tests/models/model_test_util.h"
#include "tests/test_util.h"

namespace zeroth {
namespace {

using testing::expect_within_sum_bound;
using testing::OnDevice;
using testing::random_vec;
using testing::Vec;

// The slice of `full` (shape `shape`) that tensor-parallel rank r of n holds when cut along `axis`.
Vec slice_of(const Vec& full, std::vector<int64_t> shape, int axis, int r, int n) {
  ParamSpec p{"w", std::move(shape), {}};
  const ParamSpec cut = p.cut(axis, 1, r, n);
  Vec out(cut.numel());
  cut.tp.take(full.data(), out.data(), out.size());
  return out;
}

class TensorParallelKernels : public testing::DeviceTest {};

// Y = (X W1^T + b1) W2^T + b2 with W1 [F, C] cut by rows (column-parallel) and W2 [C, F] by
// columns (row-parallel): rank r computes its F / tp hidden units and a partial Y; the sum over the
// ranks is Y. Backward from dY: dX is the sum of the ranks' partial dX, dW1 and dW2 their slices.
TEST_P(TensorParallelKernels, ColumnThenRowParallelLinearsEqualTheUnsplitPair) {
  const int N = 24, C = 16, F = 64;
  std::mt19937 rng(5);
  const Vec X = random_vec(N * C, rng), W1 = random_vec(F * C, rng, 0.3f), b1 = random_vec(F, rng), W2 = random_vec(C * F, rng, 0.3f),
            b2 = random_vec(C, rng), dY = random_vec(N * C, rng);
  // float64 references and the sums of |terms| that bound each element's f32 error.
  std::vector<double> H(N * F), Ha(N * F), Y(N * C), Ya(N * C), dH(N * F), dHa(N * F), dX(N * C), dXa(N * C), dW1(F * C), dW1a(F * C);
  std::vector<double> dW2(C * F), dW2a(C * F), db1(F), db1a(F);
  for (int n = 0; n < N; ++n) {
    for (int f = 0; f < F; ++f) {
      double s = b1[f], a = std::abs(b1[f]);
      for (int c = 0; c < C; ++c) s += double(X[n * C + c]) * W1[f * C + c], a += std::abs(double(X[n * C + c]) * W1[f * C + c]);
      H[n * F + f] = s, Ha[n * F + f] = a;
    }
  }
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) {
      double s = b2[c], a = std::abs(b2[c]);
      for (int f = 0; f < F; ++f) s += H[n * F + f] * W2[c * F + f], a += Ha[n * F + f] * std::abs(W2[c * F + f]);
      Y[n * C + c] = s, Ya[n * C + c] = a;
      (void)a;
    }
    for (int f = 0; f < F; ++f) {
      double s = 0, a = 0;
      for (int c = 0; c < C; ++c) s += double(dY[n * C + c]) * W2[c * F + f], a += std::abs(double(dY[n * C + c]) * W2[c * F + f]);
      dH[n * F + f] = s, dHa[n * F + f] = a;
    }
    for (int c = 0; c < C; ++c) {
      double s = 0, a = 0;
      for (int f = 0; f < F; ++f) s += dH[n * F + f] * W1[f * C + c], a += dHa[n * F + f] * std::abs(W1[f * C + c]);
      dX[n * C + c] = s, dXa[n * C + c] = a;
    }
  }
  for (int f = 0; f < F; ++f) {
    for (int c = 0; c < C; ++c) {
      double s = 0, a = 0;
      for (int n = 0; n < N; ++n) s += dH[n * F + f] * X[n * C + c], a += dHa[n * F + f] * std::abs(X[n * C + c]);
      dW1[f * C + c] = s, dW1a[f * C + c] = a;
      s = 0, a = 0;
      for (int n = 0; n < N; ++n) s += double(dY[n * C + c]) * H[n * F + f], a += std::abs(double(dY[n * C + c])) * Ha[n * F + f];
      dW2[c * F + f] = s, dW2a[c * F + f] = a;
    }
    double s = 0, a = 0;
    for (int n = 0; n < N; ++n) s += dH[n * F + f], a += dHa[n * F + f];
    db1[f] = s, db1a[f] = a;
  }
  Stream& stream = device_->default_stream();
  auto k = gpt::make_kernels(stream);
  for (int tp : {1, 2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    OnDevice d{*device_, {}};
    float* x = d.put(X);
    float* dy = d.put(dY);
    const int Fr = F / tp;
    Vec y_sum(N * C, 0.0f), dx_sum(N * C, 0.0f), dw1(F * C, 0.0f), dw2(C * F, 0.0f), gbias1(F, 0.0f);
    for (int r = 0; r < tp; ++r) {
      float* w1 = d.put(slice_of(W1, {F, C}, 0, r, tp));
      float* bias1 = d.put(slice_of(b1, {F}, 0, r, tp));
      float* w2 = d.put(slice_of(W2, {C, F}, 1, r, tp));
      float* bias2 = d.put(b2);
      float *h = d.zeros(N * Fr), *y = d.zeros(N * C), *dh = d.zeros(N * Fr), *dx = d.zeros(N * C);
      float *gw1 = d.zeros(Fr * C), *gb1 = d.zeros(Fr), *gw2 = d.zeros(C * Fr);
      k->submit([&] {
        k->matmul_forward(h, x, w1, bias1, N, C, Fr);
        k->matmul_forward(y, h, w2, r == 0 ? bias2 : nullptr, N, Fr, C);  // the bias once in the sum
        k->matmul_backward(dh, gw2, nullptr, dy, h, w2, N, Fr, C);
        k->matmul_backward(dx, gw1, gb1, dh, x, w1, N, C, Fr);
      });
      const Vec yr = d.get(y, N * C), dxr = d.get(dx, N * C), gw1r = d.get(gw1, Fr * C), gw2r = d.get(gw2, C * Fr),
                gb1r = d.get(gb1, Fr);
      for (size_t i = 0; i < yr.size(); ++i) y_sum[i] += yr[i], dx_sum[i] += dxr[i];
      // The rank's rows of dW1 and db1, and columns of dW2, go back to their place in the whole.
      auto place = [&](const Vec& part, std::vector<int64_t> shape, int axis, Vec& whole) {
        ParamSpec{"w", std::move(shape), {}}.cut(axis, 1, r, tp).tp.put(part.data(), whole.data(), part.size());
      };
      place(gw1r, {F, C}, 0, dw1);
      place(gw2r, {C, F}, 1, dw2);
      place(gb1r, {F}, 0, gbias1);
    }
    // The partial sums add tp more roundings, each within the bound's slack (k + 2).
    expect_within_sum_bound("Y", y_sum, Y, Ya, C + F + tp);
    expect_within_sum_bound("dX", dx_sum, dX, dXa, C + F + tp);
    expect_within_sum_bound("dW1", dw1, dW1, dW1a, N + C);
    expect_within_sum_bound("dW2", dw2, dW2, dW2a, N + C);
    expect_within_sum_bound("db1", gbias1, db1, db1a, N + C);
  }
}

// Softmax cross-entropy over V logits split into tp slices (the first V mod tp one longer), the
// ranks' max and sums combined between the steps as the model's all-reduces combine them. The
// gradient both ways the model makes it: from the finish (logits kept), and from the logits as a
// product makes them again with the finished statistics (the loss by chunks), which must be the
// same bits. Every fourth row's target is -1, the loss mask: no loss, no gradient, not counted.
TEST_P(TensorParallelKernels, VocabularyParallelCrossEntropyEqualsTheFullOne) {
  const int N = 12, V = 50;
  std::mt19937 rng(9);
  const Vec logits = random_vec(N * V, rng, 3.0f);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = n % 4 == 3 ? -1 : static_cast<int32_t>((n * 17 + 3) % V);
  const int counted = N - N / 4;
  const float dscale = 1.0f / counted;
  // float64: the mean loss over the counted rows, and the gradient (softmax - onehot) / counted.
  double loss_ref = 0;
  std::vector<double> grad_ref(N * V, 0.0);
  for (int n = 0; n < N; ++n) {
    if (targets[n] < 0) continue;
    double m = -1e300, s = 0;
    for (int v = 0; v < V; ++v) m = std::max(m, double(logits[n * V + v]));
    for (int v = 0; v < V; ++v) s += std::exp(double(logits[n * V + v]) - m);
    loss_ref += (std::log(s) + m - logits[n * V + targets[n]]) / counted;
    for (int v = 0; v < V; ++v) grad_ref[n * V + v] = (std::exp(double(logits[n * V + v]) - m) / s - (v == targets[n])) * dscale;
  }
  Stream& stream = device_->default_stream();
  auto k = gpt::make_kernels(stream);
  for (int tp : {1, 2, 3, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    OnDevice d{*device_, {}};
    Buffer ids = device_->allocate(N * sizeof(int32_t), MemTag::other);
    device_->copy(stream, ids.data(), targets.data(), N * sizeof(int32_t));
    std::vector<float*> slices(tp), again(tp), stats(tp), row_losses(tp);
    std::vector<std::array<int64_t, 2>> parts(tp);
    for (int r = 0; r < tp; ++r) {
      parts[r] = TensorSplit::part(V, r, tp);
      slices[r] = d.put(slice_of(logits, {N, V}, 1, r, tp));
      again[r] = d.put(slice_of(logits, {N, V}, 1, r, tp));
      stats[r] = d.zeros(3 * N);
      row_losses[r] = d.put(Vec(N, -1.0f));
    }
    auto combine = [&](size_t from, size_t count, bool max) {
      Vec all(count, max ? -3.0e38f : 0.0f);
      for (int r = 0; r < tp; ++r) {
        const Vec mine = d.get(stats[r] + from, count);
        for (size_t i = 0; i < count; ++i) all[i] = max ? std::max(all[i], mine[i]) : all[i] + mine[i];
      }
      for (int r = 0; r < tp; ++r) device_->copy(stream, stats[r] + from, all.data(), count * sizeof(float));
      stream.synchronize();
    };
    for (int r = 0; r < tp; ++r)
      k->submit([&, r] { k->crossentropy_max(slices[r], N, static_cast<int>(parts[r][1] - parts[r][0]), stats[r]); });
    combine(0, N, true);
    for (int r = 0; r < tp; ++r) {
      k->submit([&, r] {
        k->crossentropy_sums(slices[r], ids.as<int32_t>(), N, static_cast<int>(parts[r][1] - parts[r][0]),
                             static_cast<int>(parts[r][0]), stats[r]);
      });
    }
    combine(N, 2 * N, false);
    std::vector<float> losses(tp);
    std::vector<Vec> rows(tp);
    for (int r = 0; r < tp; ++r) {
      const int Vr = static_cast<int>(parts[r][1] - parts[r][0]), lo = static_cast<int>(parts[r][0]);
      k->submit([&, r, Vr, lo] {
        k->crossentropy_finish(slices[r], ids.as<int32_t>(), N, Vr, lo, dscale, stats[r], row_losses[r]);
        k->crossentropy_gradient(again[r], ids.as<int32_t>(), N, Vr, lo, dscale, stats[r]);
      });
      stream.synchronize();
      rows[r] = d.get(row_losses[r], N);
      k->submit([&, r] { k->mean_loss(row_losses[r], N, counted, &losses[r]); });
    }
    stream.synchronize();
    for (int r = 0; r < tp; ++r) {
      EXPECT_EQ(losses[r], losses[0]) << "every rank computes the same loss";
      EXPECT_NEAR(losses[r], loss_ref, 2e-6 * loss_ref) << "rank " << r;
      for (int n = 0; n < N; ++n) {
        double m = -1e300, s = 0;
        for (int v = 0; v < V; ++v) m = std::max(m, double(logits[n * V + v]));
        for (int v = 0; v < V; ++v) s += std::exp(double(logits[n * V + v]) - m);
        if (targets[n] < 0) {
          EXPECT_EQ(rows[r][n], 0.0f) << "rank " << r << ", ignored row " << n;
          continue;
        }
        const double want = std::log(s) + m - logits[n * V + targets[n]];
        EXPECT_NEAR(rows[r][n], want, (V + 4) * 0x1.0p-24 + 0x1.0p-23 * std::abs(want)) << "rank " << r << ", row " << n << "'s loss";
      }
      const size_t count = static_cast<size_t>(N) * (parts[r][1] - parts[r][0]);
      EXPECT_EQ(d.get(again[r], count), d.get(slices[r], count)) << "rank " << r << ": the gradient from the logits made again";
    }
    // Each logit's gradient, from the slice that holds it: exp to ~2 ulp, then a division and a
    // product, so 8 ulp of the largest term (1 / N) bounds it.
    double worst = 0;
    for (int r = 0; r < tp; ++r) {
      const int Vr = static_cast<int>(parts[r][1] - parts[r][0]);
      const Vec g = d.get(slices[r], static_cast<size_t>(N) * Vr);
      for (int n = 0; n < N; ++n) {
        for (int v = 0; v < Vr; ++v) {
          if (targets[n] < 0) {
            ASSERT_EQ(g[n * Vr + v], 0.0f) << "ignored row " << n << ", logit " << parts[r][0] + v;
            continue;
          }
          const double want = grad_ref[n * V + parts[r][0] + v], err = std::abs(g[n * Vr + v] - want);
          worst = std::max(worst, err);
          ASSERT_LE(err, 8 * 0x1.0p-24 * dscale) << "row " << n << ", logit " << parts[r][0] + v;
        }
      }
    }
    std::printf("tp %d: loss %.7f against %.7f, worst gradient error %.3g\n", tp, losses[0], loss_ref, worst);
  }
}

// The vocabulary-parallel embedding: each rank adds the rows of the tokens its slice holds (rank 0
// the positions too); the sum over the ranks is the whole embedding, bit for bit (one non-zero term
// per element but the positions). Backward: each slice's rows collect their tokens' gradients, the
// position gradient is whole on every rank.
TEST_P(TensorParallelKernels, VocabularyParallelEmbeddingSumsToTheWholeOne) {
  const int B = 3, T = 8, C = 16, V = 50;
  std::mt19937 rng(3);
  const Vec wte = random_vec(V * C, rng), wpe = random_vec(T * C, rng), dout = random_vec(B * T * C, rng);
  std::vector<int32_t> tokens(B * T);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);
  tokens[0] = tokens[5];  // a repeated token: its rows add up in one gradient row
  Stream& stream = device_->default_stream();
  auto k = gpt::make_kernels(stream);
  Buffer ids = device_->allocate(tokens.size() * sizeof(int32_t), MemTag::other);
  device_->copy(stream, ids.data(), tokens.data(), tokens.size() * sizeof(int32_t));
  stream.synchronize();
  // float64 references: the embedding (a sum of two floats, rounded once as f32 does) and gradients.
  Vec emb(B * T * C);
  std::vector<double> dwte(V * C, 0.0), dwpe(T * C, 0.0);
  for (int n = 0; n < B * T; ++n) {
    for (int c = 0; c < C; ++c) {
      emb[n * C + c] = static_cast<float>(double(wte[tokens[n] * C + c]) + wpe[(n % T) * C + c]);
      dwte[tokens[n] * C + c] += dout[n * C + c];
      dwpe[(n % T) * C + c] += dout[n * C + c];
    }
  }
  for (int tp : {1, 2, 3, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    OnDevice d{*device_, {}};
    float* grad = d.put(dout);
    Vec sum(B * T * C, 0.0f), dwte_whole(V * C, 0.0f);
    for (int r = 0; r < tp; ++r) {
      const auto [lo, hi] = TensorSplit::part(V, r, tp);
      const int Vr = static_cast<int>(hi - lo);
      float* w = d.put(slice_of(wte, {V, C}, 0, r, tp));
      float* p = d.put(wpe);
      float *out = d.zeros(B * T * C), *gw = d.zeros(Vr * C), *gp = d.zeros(T * C);
      k->submit([&] {
        k->encoder_forward(out, ids.as<int32_t>(), w, r == 0 ? p : nullptr, B, T, C, static_cast<int>(lo), Vr);
        k->encoder_backward(gw, gp, grad, ids.as<int32_t>(), B, T, C, static_cast<int>(lo), Vr);
      });
      const Vec o = d.get(out, B * T * C), g = d.get(gw, Vr * C), gpos = d.get(gp, T * C);
      for (size_t i = 0; i < o.size(); ++i) sum[i] += o[i];
      std::copy(g.begin(), g.end(), dwte_whole.begin() + lo * C);
      // Sums of B (dwpe) or a token's few (dwte) standard normals: (terms + 1) u times their |sum| bound.
      for (int i = 0; i < T * C; ++i)
        ASSERT_NEAR(gpos[i], dwpe[i], (B + 1) * 0x1.0p-24 * 4 * B) << "rank " << r << " dwpe[" << i << "]";
    }
    EXPECT_EQ(sum, emb);
    for (int i = 0; i < V * C; ++i) ASSERT_NEAR(dwte_whole[i], dwte[i], 4 * 0x1.0p-24 * 8) << "dwte[" << i << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, TensorParallelKernels, ::testing::ValuesIn(testing::device_specs()));

TEST(TensorSplit, CutsFusedQkvByHeadsInEachSegment) {
  // [3C, C] with C = 4 over 2 ranks: rank 1 holds rows 2-3 of q, of k and of v.
  const ParamSpec qkv = ParamSpec{"attn.c_attn.weight", {12, 4}, {}}.cut(0, 3, 1, 2);
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{6, 4}));
  std::vector<std::array<size_t, 3>> runs;
  qkv.tp.for_each_run(0, qkv.numel(), [&](size_t full, size_t count, size_t local) { runs.push_back({full, count, local}); });
  EXPECT_EQ(runs, (std::vector<std::array<size_t, 3>>{{8, 8, 0}, {24, 8, 8}, {40, 8, 16}}));
  // Columns of [2, 5] over 2 ranks: rank 0 the first 3 of each row.
  const ParamSpec cols = ParamSpec{"w", {2, 5}, {}}.cut(1, 1, 0, 2);
  runs.clear();
  cols.tp.for_each_run(1, 6, [&](size_t full, size_t count, size_t local) { runs.push_back({full, count, local}); });
  EXPECT_EQ(runs, (std::vector<std::array<size_t, 3>>{{1, 2, 1}, {5, 3, 3}}));
  EXPECT_THROW(ParamSpec({"w", {10, 4}, {}}).cut(0, 3, 0, 2), InvalidArgument);  // 10 rows are not 3 segments
}

}  // namespace
}  // namespace zeroth
