// Causal attention on the CPU by blocks, after FlashAttention-2 (Dao 2023): a block of query rows
// meets the keys a chunk at a time with an online softmax, so no T x T matrix is ever held. The
// forward keeps each row's log-sum-exp; the backward recomputes a chunk's probabilities from it.
// Blocks are split over oneTBB, each block's products on its own thread; with fewer blocks than
// threads (backward's tasks are key/value heads) they run in order, each product over the library's
// threads. A head's sums add in the same order either way.
#include <algorithm>  // std::min, std::max, std::clamp, std::fill
#include <cmath>      // std::sqrt, std::log
#include <cstring>    // std::memset
#include <vector>     // std::vector

#include "core/cpu/gemm.h"  // sgemm, SerialProducts
#include "models/gpt/cpu/gpt_kernels.h"
#include "models/gpt/cpu/row_math.h"  // ZEROTH_ISA_CLONES, fast_exp, row_max, exp_shifted_sum, scale_row

namespace zeroth::gpt::cpu {
namespace {

using zeroth::cpu::sgemm;

// Query rows per block and keys per chunk. A chunk is a multiple of a block, so for blocks that
// start at a multiple of kRows (training's) the chunk holding the diagonal starts at or before the
// block's first row: every row of every chunk such a block meets has a key it may see. 64 x 256
// floats of scores stay in a core's L2.
constexpr int kRows = 64;
constexpr int kKeys = 256;
static_assert(kKeys % kRows == 0);

// x[j] = exp(x[j] - shift) for j < valid and 0 for valid <= j < n (the keys past the row's own
// position); returns the sum.
float exp_row(float* x, int valid, int n, float shift) {
  const float sum = exp_shifted_sum(x, valid, shift);
  std::fill(x + valid, x + n, 0.0f);
  return sum;
}

ZEROTH_ISA_CLONES float dot_row(const float* a, const float* b, int n) {
  float lanes[16] = {};
  int j = 0;
  for (; j + 16 <= n; j += 16) {
    for (int k = 0; k < 16; ++k) lanes[k] += a[j + k] * b[j + k];
  }
  float s = 0;
  for (float l : lanes) s += l;
  for (; j < n; ++j) s += a[j] * b[j];
  return s;
}

// The softmax's backward on one row of a chunk: dp <- p (dp - d) scale, with d = <dy, y> the row's
// sum of p dp over all its keys.
ZEROTH_ISA_CLONES void softmax_grad_row(float* dp, const float* p, int n, float d, float scale) {
  for (int j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - d) * scale;
}

// body(i) for i in [0, n): over oneTBB, each thread's products on itself, where the GEMM library
// allows that and there are at least as many blocks as threads; else in order, each product over
// the library's threads.
template <class F>
void for_blocks(size_t n, F&& body) {
  const int threads = zeroth::cpu::num_threads();
  if (threads == 1 || n < static_cast<size_t>(threads) || !zeroth::cpu::serial_products_supported()) {
    for (size_t i = 0; i < n; ++i) body(i);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n, 1), [&](const tbb::blocked_range<size_t>& r) {
    const zeroth::cpu::SerialProducts serial;
    for (size_t i = r.begin(); i < r.end(); ++i) body(i);
  });
}

// A thread's chunk of scores (or of their gradient): kRows x kKeys floats.
float* chunk_buffer(int which) {
  thread_local std::vector<float> buffers[2];
  auto& b = buffers[which];
  if (b.empty()) b.resize(static_cast<size_t>(kRows) * kKeys);
  return b.data();
}

// Where one head's rows of one sequence lie in qkv (and dqkv): rows of W floats.
struct Head {
  size_t W, Cq;
  int NH, KVH, g, hs;
  size_t q(int h) const { return static_cast<size_t>(h) * hs; }
  size_t k(int h) const { return static_cast<size_t>(NH + h / g) * hs; }
  size_t v(int h) const { return static_cast<size_t>(NH + KVH + h / g) * hs; }
};

}  // namespace

namespace {

// Rows [pos, pos + n) of each of B sequences (qkv [B, pos + n, W]) over the sequence's rows
// [0, pos + n): out [B, n, Cq], lse [B, NH, n].
void blocked_forward(float* out, float* lse, const float* qkv, int B, int pos, int n, int NH, int KVH, int hs) {
  const Head at{static_cast<size_t>(NH + 2 * KVH) * hs, static_cast<size_t>(NH) * hs, NH, KVH, NH / KVH, hs};
  const size_t W = at.W, Cq = at.Cq, Tk = static_cast<size_t>(pos) + n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int blocks = (n + kRows - 1) / kRows;
  for_blocks(static_cast<size_t>(B) * NH * blocks, [&](size_t task) {
    const int blk = static_cast<int>(task % blocks), h = static_cast<int>(task / blocks % NH),
              b = static_cast<int>(task / blocks / NH);
    // The block's rows are positions [a0, a1) of its sequence.
    const int rows = std::min(kRows, n - blk * kRows), a0 = pos + blk * kRows, a1 = a0 + rows;
    const float* seq = qkv + b * Tk * W;
    const float *q = seq + a0 * W + at.q(h), *k = seq + at.k(h), *v = seq + at.v(h);
    float* o = out + (b * static_cast<size_t>(n) + blk * kRows) * Cq + at.q(h);
    float* s = chunk_buffer(0);
    float m[kRows], l[kRows];  // each row's running max and sum of exp(score - max)
    for (int c0 = 0; c0 < a1; c0 += kKeys) {
      const int width = std::min(kKeys, a1 - c0);
      sgemm(false, true, rows, width, hs, scale, q, W, k + c0 * W, W, 0.0f, s, width);
      for (int r = 0; r < rows; ++r) {
        float* sr = s + static_cast<size_t>(r) * width;
        // Keys past the row's own position are masked. The first chunk holds key 0, which every
        // row sees; a later one may hold none of a row's keys (a block not aligned to the chunks,
        // in generation), and then leaves the row as it was.
        const int valid = std::clamp(a0 + r + 1 - c0, 0, width);
        const float mx = std::max(c0 == 0 ? -3.0e38f : m[r], row_max(sr, valid));
        const float sum = exp_row(sr, valid, width, mx);
        if (c0 == 0) {
          l[r] = sum;
        } else {
          // The row's earlier chunks were weighed against a smaller max.
          const float a = fast_exp(m[r] - mx);
          l[r] = l[r] * a + sum;
          scale_row(o + r * Cq, hs, a);
        }
        m[r] = mx;
      }
      sgemm(false, false, rows, hs, width, 1.0f, s, width, v + c0 * W, W, c0 == 0 ? 0.0f : 1.0f, o, Cq);
    }
    float* row_lse = lse + (static_cast<size_t>(b) * NH + h) * n + blk * kRows;
    for (int r = 0; r < rows; ++r) {
      scale_row(o + r * Cq, hs, 1.0f / l[r]);
      row_lse[r] = m[r] + std::log(l[r]);
    }
  });
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int KVH, int hs) {
  blocked_forward(out, lse, qkv, B, 0, T, NH, KVH, hs);
}

void attention_rows(float* out, float* att, const float* qkv, int pos, int n, int NH, int KVH, int hs) {
  blocked_forward(out, att, qkv, 1, pos, n, NH, KVH, hs);
}

void attention_backward(float* dqkv, const float* dout, const float* out, const float* qkv, const float* lse, int B, int T, int NH,
                        int KVH, int hs) {
  const Head at{static_cast<size_t>(NH + 2 * KVH) * hs, static_cast<size_t>(NH) * hs, NH, KVH, NH / KVH, hs};
  const size_t W = at.W, Cq = at.Cq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int blocks = (T + kRows - 1) / kRows;
  // A task per key/value head: it owns that head's gradients and its query heads', and adds the
  // query heads' shares in head order.
  for_blocks(static_cast<size_t>(B) * KVH, [&](size_t task) {
    const int kvh = static_cast<int>(task % KVH), b = static_cast<int>(task / KVH);
    const float* seq = qkv + static_cast<size_t>(b) * T * W;
    float* dseq = dqkv + static_cast<size_t>(b) * T * W;
    const int h0 = kvh * at.g;
    const float *k = seq + at.k(h0), *v = seq + at.v(h0);
    float *dk = dseq + at.k(h0), *dv = dseq + at.v(h0);
    for (int t = 0; t < T; ++t) {
      std::memset(dk + t * W, 0, hs * sizeof(float));
      std::memset(dv + t * W, 0, hs * sizeof(float));
    }
    float *p = chunk_buffer(0), *dp = chunk_buffer(1);
    float d[kRows];
    for (int h = h0; h < h0 + at.g; ++h) {
      for (int blk = 0; blk < blocks; ++blk) {
        const int i0 = blk * kRows, rows = std::min(kRows, T - i0), i1 = i0 + rows;
        const float* q = seq + i0 * W + at.q(h);
        float* dq = dseq + i0 * W + at.q(h);
        const size_t y_at = (static_cast<size_t>(b) * T + i0) * Cq + at.q(h);
        const float *dy = dout + y_at, *y = out + y_at;
        const float* row_lse = lse + (static_cast<size_t>(b) * NH + h) * T + i0;
        for (int r = 0; r < rows; ++r) d[r] = dot_row(dy + r * Cq, y + r * Cq, hs);
        for (int c0 = 0; c0 < i1; c0 += kKeys) {
          const int n = std::min(kKeys, i1 - c0);
          sgemm(false, true, rows, n, hs, scale, q, W, k + c0 * W, W, 0.0f, p, n);
          for (int r = 0; r < rows; ++r) exp_row(p + static_cast<size_t>(r) * n, std::min(n, i0 + r + 1 - c0), n, row_lse[r]);
          sgemm(true, false, n, hs, rows, 1.0f, p, n, dy, Cq, 1.0f, dv + c0 * W, W);  // dV += P^T dY
          sgemm(false, true, rows, n, hs, 1.0f, dy, Cq, v + c0 * W, W, 0.0f, dp, n);  // dP = dY V^T
          for (int r = 0; r < rows; ++r) {
            softmax_grad_row(dp + static_cast<size_t>(r) * n, p + static_cast<size_t>(r) * n, n, d[r], scale);
          }
          sgemm(false, false, rows, hs, n, 1.0f, dp, n, k + c0 * W, W, c0 == 0 ? 0.0f : 1.0f, dq, W);  // dQ (+)= dS K
          sgemm(true, false, n, hs, rows, 1.0f, dp, n, q, W, 1.0f, dk + c0 * W, W);                    // dK += dS^T Q
        }
      }
    }
  });
}

}  // namespace zeroth::gpt::cpu
