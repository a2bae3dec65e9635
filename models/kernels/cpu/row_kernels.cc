// GPT kernels on the CPU. GEMMs go to core/cpu/gemm.h (the library's own threads); the rest is split over oneTBB
// in fixed chunks, so reductions add in the same order whatever the thread count. The row loops
// are compiled per ISA (x86-64-v4, v3, baseline) through GCC's target_clones, which picks one at
// load time: the same single dispatch idea as core/cpu, without hand-written intrinsics, because
// these loops vectorize cleanly once exp is a polynomial instead of a libm call.
#include "models/kernels/cpu/row_kernels.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>  // std::min
#include <bit>        // std::bit_cast
#include <cmath>      // std::sqrt, std::log
#include <cstring>    // std::memcpy
#include <vector>     // std::vector

#include "core/cpu/gemm.h"                // sgemm
#include "core/cpu/kernels.h"             // cpu::num_threads
#include "models/kernels/cpu/row_math.h"  // ZEROTH_ISA_CLONES, fast_exp, for_rows

namespace zeroth::gpt::cpu {

ZEROTH_ISA_CLONES float row_max(const float* x, int n) {
  float lanes[16];
  for (float& l : lanes) l = -3.0e38f;
  int j = 0;
  for (; j + 16 <= n; j += 16) {
    for (int k = 0; k < 16; ++k) lanes[k] = x[j + k] > lanes[k] ? x[j + k] : lanes[k];
  }
  float m = -3.0e38f;
  for (float l : lanes) m = l > m ? l : m;
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// x[j] = exp(x[j] - shift); returns the sum.
ZEROTH_ISA_CLONES float exp_shifted_sum(float* x, int n, float shift) {
  float lanes[16] = {};
  int j = 0;
  for (; j + 16 <= n; j += 16) {
    for (int k = 0; k < 16; ++k) {
      const float e = fast_exp(x[j + k] - shift);
      x[j + k] = e;
      lanes[k] += e;
    }
  }
  float s = 0;
  for (float l : lanes) s += l;
  for (; j < n; ++j) {
    x[j] = fast_exp(x[j] - shift);
    s += x[j];
  }
  return s;
}

ZEROTH_ISA_CLONES void scale_row(float* x, int n, float a) {
  for (int j = 0; j < n; ++j) x[j] *= a;
}

namespace {

constexpr size_t kRowChunk = 16;  // rows per task for row-wise kernels

ZEROTH_ISA_CLONES void gelu_rows(float* out, const float* inp, size_t n) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = k * (x + 0.044715f * x * x * x);
    // 0.5 * x * (1 + tanh(u)) == x * sigmoid(2u): no cancellation near zero.
    out[i] = x / (1.0f + fast_exp(-2.0f * u));
  }
}

ZEROTH_ISA_CLONES void gelu_backward_rows(float* dinp, const float* inp, const float* dout, size_t n) {
  const float k = 0.7978845608028654f;
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = k * (x + 0.044715f * x * x * x);
    const float s = 1.0f / (1.0f + fast_exp(-2.0f * u));  // (1 + tanh u) / 2
    const float du = k * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = (s + x * 2.0f * s * (1.0f - s) * du) * dout[i];
  }
}

ZEROTH_ISA_CLONES void add_rows(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

ZEROTH_ISA_CLONES void layernorm_row(float* out, float* mean_out, float* rstd_out, const float* x, const float* w, const float* b,
                                     int C) {
  float lanes[16] = {};
  int j = 0;
  for (; j + 16 <= C; j += 16) {
    for (int k = 0; k < 16; ++k) lanes[k] += x[j + k];
  }
  float s = 0;
  for (float l : lanes) s += l;
  for (; j < C; ++j) s += x[j];
  const float m = s / C;
  for (float& l : lanes) l = 0;
  for (j = 0; j + 16 <= C; j += 16) {
    for (int k = 0; k < 16; ++k) lanes[k] += (x[j + k] - m) * (x[j + k] - m);
  }
  float v = 0;
  for (float l : lanes) v += l;
  for (; j < C; ++j) v += (x[j] - m) * (x[j] - m);
  const float rs = 1.0f / std::sqrt(v / C + 1e-5f);
  for (j = 0; j < C; ++j) out[j] = (x[j] - m) * rs * w[j] + b[j];
  *mean_out = m;
  *rstd_out = rs;
}

// One row's LayerNorm backward; dw and db are this chunk's partial sums.
ZEROTH_ISA_CLONES void layernorm_backward_row(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                                              float m, float rs, int C) {
  float l1[16] = {}, l2[16] = {};
  int j = 0;
  for (; j + 16 <= C; j += 16) {
    for (int k = 0; k < 16; ++k) {
      const float xhat = (x[j + k] - m) * rs;
      const float g = w[j + k] * dy[j + k];
      l1[k] += g;
      l2[k] += g * xhat;
    }
  }
  float mean_g = 0, mean_gx = 0;
  for (int k = 0; k < 16; ++k) {
    mean_g += l1[k];
    mean_gx += l2[k];
  }
  for (; j < C; ++j) {
    const float xhat = (x[j] - m) * rs;
    const float g = w[j] * dy[j];
    mean_g += g;
    mean_gx += g * xhat;
  }
  mean_g /= C;
  mean_gx /= C;
  for (j = 0; j < C; ++j) {
    const float xhat = (x[j] - m) * rs;
    db[j] += dy[j];
    dw[j] += xhat * dy[j];
    dx[j] += (w[j] * dy[j] - mean_g - xhat * mean_gx) * rs;
  }
}

// One RMSNorm row: out = x * rstd * w; returns rstd.
ZEROTH_ISA_CLONES float rmsnorm_row(float* out, const float* x, const float* w, int C, float eps) {
  float lanes[16] = {};
  int j = 0;
  for (; j + 16 <= C; j += 16) {
    for (int k = 0; k < 16; ++k) lanes[k] += x[j + k] * x[j + k];
  }
  float s = 0;
  for (float l : lanes) s += l;
  for (; j < C; ++j) s += x[j] * x[j];
  const float rs = 1.0f / std::sqrt(s / C + eps);
  for (j = 0; j < C; ++j) out[j] = x[j] * rs * w[j];
  return rs;
}

// One row's RMSNorm backward: dx (+)= rs (w dy - x rs^2 mean(w dy x)); dw (this chunk's partial sums)
// += dy x rs.
ZEROTH_ISA_CLONES void rmsnorm_backward_row(float* dx, float* dw, const float* dy, const float* x, const float* w, float rs, int C,
                                            bool accumulate) {
  float lanes[16] = {};
  int j = 0;
  for (; j + 16 <= C; j += 16) {
    for (int k = 0; k < 16; ++k) lanes[k] += w[j + k] * dy[j + k] * x[j + k];
  }
  float dot = 0;
  for (float l : lanes) dot += l;
  for (; j < C; ++j) dot += w[j] * dy[j] * x[j];
  const float c = rs * rs * dot / C;
  for (j = 0; j < C; ++j) {
    dw[j] += dy[j] * x[j] * rs;
    dx[j] = (accumulate ? dx[j] : 0.0f) + (w[j] * dy[j] - x[j] * c) * rs;
  }
}

// x[i], x[half + i] rotated by the angle of cosine cs[i] and sine sign * sn[i].
ZEROTH_ISA_CLONES void rotate_pairs(float* x, const float* cs, const float* sn, int half, float sign) {
  for (int i = 0; i < half; ++i) {
    const float a = x[i], b = x[half + i], s = sign * sn[i];
    x[i] = a * cs[i] - b * s;
    x[half + i] = b * cs[i] + a * s;
  }
}

ZEROTH_ISA_CLONES void swiglu_row(float* out, const float* in, int F) {
  for (int j = 0; j < F; ++j) {
    const float gate = in[j];
    out[j] = gate / (1.0f + fast_exp(-gate)) * in[F + j];
  }
}

ZEROTH_ISA_CLONES void swiglu_backward_row(float* din, const float* in, const float* dout, int F) {
  for (int j = 0; j < F; ++j) {
    const float gate = in[j], up = in[F + j];
    const float sig = 1.0f / (1.0f + fast_exp(-gate)), silu = gate * sig;
    din[j] = dout[j] * up * sig * (1.0f + gate * (1.0f - sig));
    din[F + j] = dout[j] * silu;
  }
}

// Element-wise over n values in chunks of 64 Ki.
template <class F>
void for_chunks(size_t n, F&& f) {
  constexpr size_t kChunk = size_t{1} << 16;
  const size_t chunks = (n + kChunk - 1) / kChunk;
  for_rows(chunks, 1, [&](size_t c) {
    const size_t begin = c * kChunk;
    f(begin, std::min(n, begin + kChunk) - begin);
  });
}

// A bf16 run's products take their activations rounded to bf16 (nearest even), as PyTorch's bf16
// autocast rounds its inputs (its outputs stay f32 here), on every CPU: on bf16 kernels as bf16 (rounded), elsewhere as the same
// values in f32 (rounded_f32) beside the widened weights, so a run's numbers do not depend on the CPU. Each keeps one of two
// per-thread buffers (a product's two operands).
const uint16_t* rounded(const float* x, size_t n, int slot) {
  thread_local std::vector<uint16_t> buffers[2];
  auto& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  zeroth::cpu::cast(x, DType::f32, b.data(), DType::bf16, n);
  return b.data();
}

// x rounded to bf16 as cpu::cast rounds (nearest even; a NaN stays a NaN), kept in f32: one pass.
ZEROTH_ISA_CLONES void round_to_bf16(float* out, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(static_cast<uint32_t>(bf16_of(x[i])) << 16);
}

const float* rounded_f32(const float* x, size_t n, int slot) {
  thread_local std::vector<float> buffers[2];
  auto& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  for_chunks(n, [&](size_t begin, size_t len) { round_to_bf16(b.data() + begin, x + begin, len); });
  return b.data();
}

}  // namespace

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C, int v_lo, int V) {
  for_rows(static_cast<size_t>(B) * T, kRowChunk, [&](size_t n) {
    const int32_t t = tokens[n] - v_lo;
    float* row = out + n * C;
    const float* pos = wpe != nullptr ? wpe + (n % T) * C : nullptr;
    if (t >= 0 && t < V && pos != nullptr) {
      add_rows(row, wte + static_cast<size_t>(t) * C, pos, C);
    } else if (t >= 0 && t < V) {
      std::memcpy(row, wte + static_cast<size_t>(t) * C, C * sizeof(float));
    } else if (pos != nullptr) {
      std::memcpy(row, pos, C * sizeof(float));
    } else {
      std::memset(row, 0, C * sizeof(float));
    }
  });
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C, int v_lo, int V) {
  // Rows of the same token collide in dwte, so tokens are added serially in row order; the
  // channels of a row are the vector lanes.
  for (size_t n = 0; n < static_cast<size_t>(B) * T; ++n) {
    const int32_t t = tokens[n] - v_lo;
    if (t < 0 || t >= V) continue;
    float* dst = dwte + static_cast<size_t>(t) * C;
    add_rows(dst, dst, dout + n * C, C);
  }
  if (dwpe == nullptr) return;
  for_rows(static_cast<size_t>(T), 1, [&](size_t t) {
    float* dst = dwpe + t * C;
    for (int b = 0; b < B; ++b) add_rows(dst, dst, dout + (static_cast<size_t>(b) * T + t) * C, C);
  });
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias, size_t N,
                       int C) {
  for_rows(N, kRowChunk, [&](size_t n) { layernorm_row(out + n * C, mean + n, rstd + n, inp + n * C, weight, bias, C); });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                        const float* mean, const float* rstd, size_t N, int C) {
  const size_t chunks = (N + kRowChunk - 1) / kRowChunk;
  std::vector<float> partial(chunks * 2 * C, 0.0f);
  for_rows(chunks, 1, [&](size_t c) {
    float* dw = partial.data() + c * 2 * C;
    float* db = dw + C;
    for (size_t n = c * kRowChunk; n < std::min(N, (c + 1) * kRowChunk); ++n) {
      layernorm_backward_row(dinp + n * C, dw, db, dout + n * C, inp + n * C, weight, mean[n], rstd[n], C);
    }
  });
  for (size_t c = 0; c < chunks; ++c) {
    if (dweight != nullptr) add_rows(dweight, dweight, partial.data() + c * 2 * C, C);
    if (dbias != nullptr) add_rows(dbias, dbias, partial.data() + c * 2 * C + C, C);
  }
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, size_t N, int IC, int OC,
                    const uint16_t* weight_bf16) {
  float beta = 0.0f;
  if (bias != nullptr) {
    for_rows(N, kRowChunk, [&](size_t n) { std::memcpy(out + n * OC, bias, sizeof(float) * OC); });
    beta = 1.0f;
  }
  const int64_t n = static_cast<int64_t>(N);
  if (weight_bf16 == nullptr) return zeroth::cpu::sgemm(false, true, n, OC, IC, 1.0f, inp, IC, weight, IC, beta, out, OC);
  if (zeroth::cpu::gemm_bf16_native()) {
    return zeroth::cpu::gemm_bf16(false, true, n, OC, IC, 1.0f, rounded(inp, N * IC, 0), IC, weight_bf16, IC, beta, out, OC);
  }
  zeroth::cpu::sgemm(false, true, n, OC, IC, 1.0f, rounded_f32(inp, N * IC, 0), IC, weight, IC, beta, out, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, size_t N,
                     int IC, int OC, const uint16_t* weight_bf16) {
  const int64_t n = static_cast<int64_t>(N);
  if (weight_bf16 == nullptr) {
    if (dinp != nullptr) zeroth::cpu::sgemm(false, false, n, IC, OC, 1.0f, dout, OC, weight, IC, 0.0f, dinp, IC);
    if (dweight != nullptr) zeroth::cpu::sgemm(true, false, OC, IC, n, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
  } else if (zeroth::cpu::gemm_bf16_native()) {
    const uint16_t* dy = rounded(dout, N * OC, 0);
    if (dinp != nullptr) zeroth::cpu::gemm_bf16(false, false, n, IC, OC, 1.0f, dy, OC, weight_bf16, IC, 0.0f, dinp, IC);
    if (dweight != nullptr)
      zeroth::cpu::gemm_bf16(true, false, OC, IC, n, 1.0f, dy, OC, rounded(inp, N * IC, 1), IC, 1.0f, dweight, IC);
  } else {
    const float* dy = rounded_f32(dout, N * OC, 0);
    if (dinp != nullptr) zeroth::cpu::sgemm(false, false, n, IC, OC, 1.0f, dy, OC, weight, IC, 0.0f, dinp, IC);
    if (dweight != nullptr)
      zeroth::cpu::sgemm(true, false, OC, IC, n, 1.0f, dy, OC, rounded_f32(inp, N * IC, 1), IC, 1.0f, dweight, IC);
  }
  if (dbias != nullptr) {
    const size_t chunks = (N + 63) / 64;
    std::vector<float> partial(chunks * OC, 0.0f);
    for_rows(chunks, 1, [&](size_t c) {
      float* dst = partial.data() + c * OC;
      for (size_t r = c * 64; r < std::min(N, (c + 1) * 64); ++r) add_rows(dst, dst, dout + r * OC, OC);
    });
    for (size_t c = 0; c < chunks; ++c) add_rows(dbias, dbias, partial.data() + c * OC, OC);
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, size_t N, int groups, int C, size_t ld,
                     float eps) {
  for_rows(N * groups, kRowChunk, [&](size_t r) {
    const size_t at = r / groups * ld + r % groups * C;
    rstd[r] = rmsnorm_row(out + at, inp + at, weight, C, eps);
  });
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight, const float* rstd,
                      size_t N, int groups, int C, size_t ld, bool accumulate) {
  const size_t rows = N * groups, chunks = (rows + kRowChunk - 1) / kRowChunk;
  std::vector<float> partial(chunks * C, 0.0f);
  for_rows(chunks, 1, [&](size_t c) {
    for (size_t r = c * kRowChunk; r < std::min(rows, (c + 1) * kRowChunk); ++r) {
      const size_t at = r / groups * ld + r % groups * C;
      rmsnorm_backward_row(dinp + at, partial.data() + c * C, dout + at, inp + at, weight, rstd[r], C, accumulate);
    }
  });
  if (dweight == nullptr) return;
  for (size_t c = 0; c < chunks; ++c) add_rows(dweight, dweight, partial.data() + c * C, C);
}

void rope(float* x, const float* table, size_t N, int T, size_t ld, int heads, int hs, bool inverse) {
  const int half = hs / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  for_rows(N, kRowChunk, [&](size_t n) {
    const float* cs = table + (n % T) * hs;
    for (int h = 0; h < heads; ++h) rotate_pairs(x + n * ld + static_cast<size_t>(h) * hs, cs, cs + half, half, sign);
  });
}

void swiglu_forward(float* out, const float* inp, size_t N, int F) {
  for_rows(N, kRowChunk, [&](size_t n) { swiglu_row(out + n * F, inp + n * 2 * F, F); });
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, size_t N, int F) {
  for_rows(N, kRowChunk, [&](size_t n) { swiglu_backward_row(dinp + n * 2 * F, inp + n * 2 * F, dout + n * F, F); });
}

void moe_dispatch(float* out, const float* x, const int32_t* row_token, size_t R, int C) {
  for_rows(R, kRowChunk, [&](size_t r) { std::memcpy(out + r * C, x + static_cast<size_t>(row_token[r]) * C, C * sizeof(float)); });
}

void moe_dispatch_backward(float* dx, const float* drows, const int32_t* row, size_t N, int k, int C) {
  for_rows(N, kRowChunk, [&](size_t n) {
    for (int j = 0; j < k; ++j) {
      if (const int32_t r = row[n * k + j]; r >= 0) add_rows(dx + n * C, dx + n * C, drows + static_cast<size_t>(r) * C, C);
    }
  });
}

ZEROTH_ISA_CLONES void scaled_add_row(float* y, float a, const float* x, int C) {
  for (int c = 0; c < C; ++c) y[c] += a * x[c];
}

ZEROTH_ISA_CLONES float dot_row(const float* a, const float* b, int C) {
  float sum = 0;
  for (int c = 0; c < C; ++c) sum += a[c] * b[c];
  return sum;
}

void moe_combine(float* y, const float* rows, const int32_t* row, const float* weight, size_t N, int k, int C) {
  for_rows(N, kRowChunk, [&](size_t n) {
    float* out = y + n * C;
    std::fill(out, out + C, 0.0f);
    for (int j = 0; j < k; ++j) {
      if (const int32_t r = row[n * k + j]; r >= 0) scaled_add_row(out, weight[n * k + j], rows + static_cast<size_t>(r) * C, C);
    }
  });
}

void moe_combine_backward(float* drows, float* dweight, const float* dy, const float* rows, const int32_t* row, const float* weight,
                          size_t N, int k, int C) {
  for_rows(N, kRowChunk, [&](size_t n) {
    const float* g = dy + n * C;
    for (int j = 0; j < k; ++j) {
      const size_t i = n * k + j;
      const int32_t r = row[i];
      if (r < 0) {
        dweight[i] = 0;
        continue;
      }
      dweight[i] = dot_row(g, rows + static_cast<size_t>(r) * C, C);
      float* d = drows + static_cast<size_t>(r) * C;
      for (int c = 0; c < C; ++c) d[c] = weight[i] * g[c];
    }
  });
}

void gelu_forward(float* out, const float* inp, size_t n) {
  for_chunks(n, [&](size_t begin, size_t len) { gelu_rows(out + begin, inp + begin, len); });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  for_chunks(n, [&](size_t begin, size_t len) { gelu_backward_rows(dinp + begin, inp + begin, dout + begin, len); });
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  for_chunks(n, [&](size_t begin, size_t len) { add_rows(out + begin, a + begin, b + begin, len); });
}

void accumulate(float* y, const float* x, size_t n) {
  for_chunks(n, [&](size_t begin, size_t len) { add_rows(y + begin, y + begin, x + begin, len); });
}

void crossentropy_max(const float* logits, size_t N, int V, float* max) {
  for_rows(N, 1, [&](size_t n) { max[n] = V > 0 ? row_max(logits + n * V, V) : -3.0e38f; });
}

void crossentropy_sums(float* logits, const int32_t* targets, size_t N, int V, int v_lo, const float* max, float* sums,
                       float* picked) {
  for_rows(N, 1, [&](size_t n) {
    float* row = logits + n * V;
    const int32_t t = targets[n] - v_lo;
    picked[n] = t >= 0 && t < V ? row[t] : 0.0f;
    sums[n] = exp_shifted_sum(row, V, max[n]);
  });
}

namespace {
// (softmax - onehot) * dlogits_scale from the row's exp values; zero for an ignored row.
void exp_row_to_gradient(float* row, int32_t target, int V, int v_lo, float sum, float dlogits_scale) {
  if (target < 0) {
    std::fill(row, row + V, 0.0f);
    return;
  }
  scale_row(row, V, dlogits_scale / sum);
  const int32_t t = target - v_lo;
  if (t >= 0 && t < V) row[t] -= dlogits_scale;
}
}  // namespace

void crossentropy_finish(float* logits, const int32_t* targets, size_t N, int V, int v_lo, const float* max, const float* sums,
                         const float* picked, float dlogits_scale, float* losses) {
  for_rows(N, 1, [&](size_t n) {
    losses[n] = targets[n] < 0 ? 0.0f : static_cast<float>(std::log(static_cast<double>(sums[n])) + max[n] - picked[n]);
    if (dlogits_scale != 0.0f) exp_row_to_gradient(logits + n * V, targets[n], V, v_lo, sums[n], dlogits_scale);
  });
}

void crossentropy_gradient(float* logits, const int32_t* targets, size_t N, int V, int v_lo, const float* max, const float* sums,
                           float dlogits_scale) {
  for_rows(N, 1, [&](size_t n) {
    float* row = logits + n * V;
    if (targets[n] >= 0) exp_shifted_sum(row, V, max[n]);  // the row becomes its exp values; the sum is the ranks' (sums)
    exp_row_to_gradient(row, targets[n], V, v_lo, sums[n], dlogits_scale);
  });
}

}  // namespace zeroth::gpt::cpu
