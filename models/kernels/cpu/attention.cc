// Causal attention on the CPU by blocks, after FlashAttention-2 (Dao 2023): a block of query rows
// meets the keys a chunk at a time with an online softmax, so no T x T matrix is ever held. The
// forward keeps each row's log-sum-exp; the backward recomputes a chunk's probabilities from it.
//
// A chunk's scores are made transposed, S^T = K Q^T ([keys, queries]), so the products read keys,
// values and every block-sized operand where they lie (attention_isa.h's products take either
// orientation of their left operand) and only the block's queries and output gradient are copied
// transposed, once a block. The softmax passes then run element-wise across the block's queries.
// Forward tasks are blocks of query rows, or in a bf16 call over enough key/value heads, whole heads
// (each packing its keys and values where its products then find them in cache); backward's are
// key/value heads, or where those are fewer than the threads, chunks of keys and then blocks of
// queries. Every sum runs in one fixed order, so results depend neither on the threads nor on the
// ISA.
//
// A bf16 run's products take bf16 pairs (attention_isa.h's PairProduct): two terms of a dot product
// in 32 bits. Keys and values are packed once a call, the block's queries and output gradient once
// a block, each in the layout its product reads: along the dot product's terms where it is A, by
// pairs of rows where it is B, or transposed. The softmax passes write the probabilities and the
// score gradients as pairs themselves, so those take no pass of their own.
#include <algorithm>  // std::min, std::max, std::clamp, std::fill
#include <cmath>      // std::sqrt, std::log
#include <cstdint>    // uint32_t
#include <vector>     // std::vector

#include "core/error.h"  // ZEROTH_CHECK

#include "models/kernels/cpu/attention_isa.h"
#include "models/kernels/cpu/row_kernels.h"
#include "models/kernels/cpu/row_math.h"  // ZEROTH_ISA_CLONES, for_rows

namespace zeroth::gpt::cpu {
namespace {

// Query rows per block and keys per chunk. A chunk is a multiple of a block, so for blocks that
// start at a multiple of kRows (training's) the chunk holding the diagonal starts at or before the
// block's first row: every query of such a block sees a key of every chunk it meets. A chunk's
// 128 x 64 scores (32 KiB) stay in a core's L2 with the products' other operands.
constexpr int kRows = kBlockRows;
constexpr int kKeys = 128;
static_assert(kKeys % kRows == 0);
constexpr float kMasked = -3.0e38f;  // a score the causal mask hides: its exp is 0

const AttentionIsa& isa() {
  static const AttentionIsa& loops = attention_isa(zeroth::cpu::active_simd_level());
  return loops;
}

// C (+)= alpha A B; A's element (i, k) at a[i a_row + k a_col]; `zeros` and `shift` say which part
// of a diagonal chunk the mask makes nothing, scale_c and scale_out how C's rows are scaled
// (attention_isa.h).
void multiply(int m, int n, int k, float alpha, const float* a, size_t a_row, size_t a_col, const float* b, size_t ldb, float* c,
              size_t ldc, bool accumulate, Zeros zeros, int shift, const float* scale_c = nullptr, const float* scale_out = nullptr) {
  isa().product(Product{m, n, k, alpha, a, a_row, a_col, b, ldb, c, ldc, accumulate, zeros, shift, scale_c, scale_out});
}

// The query lanes a block of `rows` rows runs over: rows rounded up to 16.
int lanes_of(int rows) { return (rows + 15) / 16 * 16; }

// Asks for `rows` rows of hs floats at src, ld apart, to be brought into cache: the next block's
// (the tasks of one thread are mostly consecutive), which otherwise stall its copy on memory.
void prefetch_rows(const float* src, int rows, size_t ld, int hs) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < hs; c += 16) __builtin_prefetch(src + r * ld + c, 0, 2);
  }
}

// Sets to `value`, in a transposed chunk of keys [c0, c0 + n) against queries [a0, a0 + lanes),
// the entries of keys after their query (key c0 + j is seen by queries from c0 + j on): the part a
// product with Zeros::columns_before may have left unwritten.
void mask_chunk(float* st, int n, int lanes, int c0, int a0, float value) {
  for (int j = std::max(0, a0 + 1 - c0); j < n; ++j) {
    std::fill(st + static_cast<size_t>(j) * kRows, st + static_cast<size_t>(j) * kRows + std::min(lanes, c0 + j - a0), value);
  }
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

// A thread's buffer `which` of at least n elements.
template <class T = float>
T* thread_buffer(int which, size_t n) {
  thread_local std::vector<T> buffers[9];
  auto& b = buffers[which];
  if (b.size() < n) b.resize(n);
  return b.data();
}

void multiply_pairs(int m, int n, int k, float alpha, const uint32_t* a, size_t a_row, size_t a_col, const uint32_t* b, size_t ldb,
                    float* c, size_t ldc, bool accumulate, Zeros zeros, int shift, const float* scale_c = nullptr,
                    const float* scale_out = nullptr) {
  isa().pair_product(PairProduct{m, n, k, alpha, a, a_row, a_col, b, ldb, c, ldc, accumulate, zeros, shift, scale_c, scale_out});
}

void pack_along_rows(uint32_t* dst, size_t ldd, const float* src, size_t ld, int rows, int width) {
  isa().pack_along_rows(dst, ldd, src, ld, rows, width);
}
void pack_row_pairs(uint32_t* dst, size_t ldd, const float* src, size_t ld, int rows, int width) {
  isa().pack_row_pairs(dst, ldd, src, ld, rows, width);
}

// dst [hs / 2, kBlockRows] = `rows` rows of hs floats at src (ld apart), rounded, paired along the
// row and transposed: a block's queries or output gradient as the B of K Q^T or V dY^T.
void pack_transposed(uint32_t* dst, const float* src, int rows, size_t ld, int hs) {
  uint32_t* along = thread_buffer<uint32_t>(7, static_cast<size_t>(kRows) * hs / 2);
  pack_along_rows(along, hs / 2, src, ld, rows, hs);
  isa().transpose_pairs(dst, along, rows, hs / 2, hs / 2);
}

// Where a call's operands lie. Queries: B sequences of n rows, ldq floats apart and q_seq floats
// from one sequence's first row to the next's, query head h at column h hs. Keys and values: `keys`
// rows a sequence, ldkv and kv_seq alike, key/value head j's keys at column j hs and its values at
// (KVH + j) hs. The first query sits `pos` positions after the first key: a whole sequence's causal
// attention has pos 0 (query i sees keys up to i); generation's rows pos = keys - n; a block of queries
// wholly after its keys (ring attention) pos >= keys, and every query sees every key. The gradients
// (dq, dkv) lie as their operands; out and dout [B, n, NH hs]; lse [B, NH] rows of n, lse_ld apart.
struct Layout {
  const float* q;
  size_t ldq, q_seq;
  const float* kv;
  size_t ldkv, kv_seq, lse_ld;
  int B, n, keys, pos, NH, KVH, g, hs;
  size_t Cq() const { return static_cast<size_t>(NH) * hs; }
  size_t qh(int h) const { return static_cast<size_t>(h) * hs; }
  size_t k(int h) const { return static_cast<size_t>(h / g) * hs; }
  size_t v(int h) const { return static_cast<size_t>(KVH + h / g) * hs; }
  const float* q_of(int b) const { return q + b * q_seq; }
  const float* kv_of(int b) const { return kv + b * kv_seq; }
  size_t lse_at(int b, int h) const { return (static_cast<size_t>(b) * NH + h) * lse_ld; }
};

// Whole sequences of interleaved rows qkv [B, T, (NH + 2 KVH) hs]: queries then keys and values.
Layout interleaved(const float* qkv, int B, int T, int NH, int KVH, int hs) {
  const size_t W = static_cast<size_t>(NH + 2 * KVH) * hs, seq = static_cast<size_t>(T) * W;
  return {qkv, W, seq, qkv + static_cast<size_t>(NH) * hs, W, seq, static_cast<size_t>(T), B, T, T, 0, NH, KVH, NH / KVH, hs};
}

// One key/value head's keys and values of a bf16 call as pairs, in the layouts the products read:
// `rows` along the channels (T x hs / 2: A of K Q^T and V dY^T), `row_pairs` by pairs of rows
// ((T + 1) / 2 x hs: B of P V and dS K; a last odd row's partner is 0). The forward packs K along
// rows and V by row pairs, the backward K and V along rows and K by row pairs; what a pass does not
// read is left null.
struct HeadPairs {
  const uint32_t *k_rows = nullptr, *v_rows = nullptr, *k_row_pairs = nullptr, *v_row_pairs = nullptr;
};

// Pairs one layout of a head's keys or values takes (either layout fits), and the layouts a pass
// packs.
size_t layout_pairs(size_t T, int hs) { return (T + 1) / 2 * hs; }
int layouts(bool backward) { return backward ? 3 : 2; }

// Packs sequence b's key/value head kvh (its L.keys rows) into `store` (layouts x layout_pairs), for
// the forward or the backward.
HeadPairs pack_head(uint32_t* store, const Layout& L, int b, int kvh, bool backward) {
  const size_t size = layout_pairs(L.keys, L.hs);
  const int hs = L.hs, rows = L.keys, h = kvh * L.g;  // h: a query head this key/value head serves
  const float* seq = L.kv_of(b);
  uint32_t *first = store, *second = store + size;
  pack_along_rows(first, hs / 2, seq + L.k(h), L.ldkv, rows, hs);
  if (!backward) {
    pack_row_pairs(second, hs, seq + L.v(h), L.ldkv, rows, hs);
    return {.k_rows = first, .v_row_pairs = second};
  }
  uint32_t* third = store + 2 * size;
  pack_along_rows(second, hs / 2, seq + L.v(h), L.ldkv, rows, hs);
  pack_row_pairs(third, hs, seq + L.k(h), L.ldkv, rows, hs);
  return {.k_rows = first, .v_rows = second, .k_row_pairs = third};
}

// Where a call runs over few key/value heads (fewer tasks than this many a thread), every head is
// packed first, in a pass of its own, and the tasks split the heads' work finer; else a task takes a
// whole head and packs it itself, where its products find it in cache.
constexpr int kHeadTasksPerThread = 4;
bool packs_by_head(int B, int KVH) { return B * KVH >= kHeadTasksPerThread * zeroth::cpu::num_threads(); }

// Every head of a call packed, held by the calling thread.
struct PackedKv {
  std::vector<HeadPairs> heads;  // [b KVH + kvh]
  const HeadPairs& at(int b, int kvh, int KVH) const { return heads[static_cast<size_t>(b) * KVH + kvh]; }
};

PackedKv pack_all(const Layout& L, bool backward) {
  const size_t heads = static_cast<size_t>(L.B) * L.KVH, per_head = layout_pairs(L.keys, L.hs) * layouts(backward);
  thread_local std::vector<uint32_t> store;
  store.resize(heads * per_head);
  uint32_t* base = store.data();  // the calling thread's: the tasks run on others too
  PackedKv kv{std::vector<HeadPairs>(heads)};
  for_rows(heads, 1, [&](size_t task) {
    const int kvh = static_cast<int>(task % L.KVH), b = static_cast<int>(task / L.KVH);
    kv.heads[task] = pack_head(base + task * per_head, L, b, kvh, backward);
  });
  return kv;
}

// A thread's store for the one head it packs at a time.
uint32_t* head_store(size_t T, int hs, bool backward) { return thread_buffer<uint32_t>(8, layout_pairs(T, hs) * layouts(backward)); }

// The call's queries over their keys (Layout): out (normalised over those keys) and lse. `pairs`:
// bf16 products.
void blocked_forward(float* out, float* lse, const Layout& L, bool pairs) {
  const size_t Cq = L.Cq();
  const int n = L.n, hs = L.hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int blocks = (n + kRows - 1) / kRows;
  // Query head h's block blk of sequence b, over its key/value head's pairs `kv` in a bf16 call.
  auto block = [&](int b, int h, int blk, const HeadPairs& kv) {
    // The block's rows r0 on are positions [a0, a1) (keys count from 0); it meets keys [0, end).
    const int r0 = blk * kRows, rows = std::min(kRows, n - r0), lanes = lanes_of(rows), a0 = L.pos + r0, a1 = a0 + rows;
    const int end = std::min(a1, L.keys);
    const float* q = L.q_of(b) + r0 * L.ldq + L.qh(h);
    const float *k = L.kv_of(b) + L.k(h), *v = L.kv_of(b) + L.v(h);
    float* o = out + (b * static_cast<size_t>(n) + r0) * Cq + L.qh(h);
    float *st = thread_buffer(0, static_cast<size_t>(kKeys) * kRows), *qt = thread_buffer(1, static_cast<size_t>(hs) * kRows);
    uint32_t *qt2 = nullptr, *p2 = nullptr;
    const uint32_t *k2 = nullptr, *v2 = nullptr;
    if (pairs) {
      qt2 = thread_buffer<uint32_t>(0, static_cast<size_t>(hs) / 2 * kRows);
      p2 = thread_buffer<uint32_t>(1, static_cast<size_t>(kKeys) / 2 * kRows);
      k2 = kv.k_rows, v2 = kv.v_row_pairs;
      pack_transposed(qt2, q, rows, L.ldq, hs);
    } else {
      isa().transpose(qt, q, rows, L.ldq, hs);
    }
    if (blk + 1 < blocks) prefetch_rows(q + kRows * L.ldq, std::min(kRows, n - (blk + 1) * kRows), L.ldq, hs);
    // Each query's running max and sum of exp(score - max), and the chunk's rescaling of both.
    alignas(64) float m[kRows], l[kRows], alpha[kRows], inverse_l[kRows];
    for (int c0 = 0; c0 < end; c0 += kKeys) {
      const int width = std::min(kKeys, end - c0);
      // S^T = scale K Q^T: key c0 + j against the queries from c0 + j on.
      if (pairs) {
        multiply_pairs(width, lanes, hs / 2, scale, k2 + c0 * hs / 2, hs / 2, 1, qt2, kRows, st, kRows, false, Zeros::columns_before,
                       c0 - a0);
      } else {
        multiply(width, lanes, hs, scale, k + c0 * L.ldkv, L.ldkv, 1, qt, kRows, st, kRows, false, Zeros::columns_before, c0 - a0);
      }
      mask_chunk(st, width, lanes, c0, a0, kMasked);
      // The first chunk holds key 0, which every query sees; a later one may hold none of a
      // query's keys (a block not aligned to the chunks, in generation) and leaves it as it was.
      isa().softmax_chunk(st, width, lanes, m, l, alpha, c0 == 0, p2);  // in pairs: P by pairs of keys
      // O (+)= P V: query a0 + i over the keys up to a0 + i. The output so far was weighed against
      // smaller maxima (alpha); after the last chunk, O / l.
      const bool last = c0 + kKeys >= end;
      if (last) {
        for (int r = 0; r < rows; ++r) inverse_l[r] = 1.0f / l[r];
      }
      const float *keep = c0 > 0 ? alpha : nullptr, *divide = last ? inverse_l : nullptr;
      if (pairs) {
        multiply_pairs(rows, hs, (width + 1) / 2, 1.0f, p2, 1, kRows, v2 + c0 / 2 * hs, hs, o, Cq, c0 > 0, Zeros::k_after, a0 - c0,
                       keep, divide);
      } else {
        multiply(rows, hs, width, 1.0f, st, 1, kRows, v + c0 * L.ldkv, L.ldkv, o, Cq, c0 > 0, Zeros::k_after, a0 - c0, keep, divide);
      }
    }
    float* row_lse = lse + L.lse_at(b, h) + r0;
    for (int r = 0; r < rows; ++r) row_lse[r] = m[r] + std::log(l[r]);
  };
  if (pairs && packs_by_head(L.B, L.KVH)) {
    // A task per key/value head: its pairs, then each of its query heads' blocks.
    for_rows(static_cast<size_t>(L.B) * L.KVH, 1, [&](size_t task) {
      const int kvh = static_cast<int>(task % L.KVH), b = static_cast<int>(task / L.KVH);
      const HeadPairs kv = pack_head(head_store(L.keys, hs, false), L, b, kvh, false);
      for (int h = kvh * L.g; h < (kvh + 1) * L.g; ++h) {
        for (int blk = 0; blk < blocks; ++blk) block(b, h, blk, kv);
      }
    });
    return;
  }
  const PackedKv kv = pairs ? pack_all(L, false) : PackedKv{};
  for_rows(static_cast<size_t>(L.B) * L.NH * blocks, 1, [&](size_t task) {
    const int blk = static_cast<int>(task % blocks), h = static_cast<int>(task / blocks % L.NH),
              b = static_cast<int>(task / blocks / L.NH);
    block(b, h, blk, pairs ? kv.at(b, h / L.g, L.KVH) : HeadPairs{});
  });
}

// Whether a call's products go in bf16 pairs.
bool in_pairs(DType products, int hs) {
  ZEROTH_CHECK(products == DType::f32 || products == DType::bf16, "attention's products are f32 or bf16, not {}",
               dtype_name(products));
  return products == DType::bf16 && hs % 2 == 0;
}


// Long: `prepare` and `meet` share the head layout, the products' dtype and the block sizes, and the one-pass and two-pass
// ways of running them must sum each gradient in the same order; kept in one function, that order reads in one place.
// `accumulate`: every gradient is added to what dq and dkv hold (ring attention's blocks); else dq and
// dkv are overwritten.
void blocked_backward(float* dq_all, float* dkv_all, const float* dout, const float* out, const float* lse, const Layout& L,
                      bool pairs, AttentionPasses passes, bool accumulate) {
  const size_t Cq = L.Cq();
  const int hs = L.hs, B = L.B, KVH = L.KVH, NH = L.NH, n_rows = L.n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int blocks = (n_rows + kRows - 1) / kRows, chunks = (L.keys + kKeys - 1) / kKeys;

  // One block of a query head's rows, made ready for the chunks it meets: its queries and output
  // gradient transposed, each row's log-sum-exp and sum of dY Y.
  // In pairs: its queries and output gradient also paired and transposed (B of K Q^T and V dY^T)
  // and by pairs of rows (B of dS^T Q and P^T dY).
  // Rows r0 on are positions [i0, i1); they meet keys [0, end).
  struct Block {
    int h, r0, i0, rows, lanes, i1, end;
    const float *q, *dy;
    float *qt, *dyt;
    uint32_t *qt2, *dyt2, *q2, *dy2;
    alignas(64) float d[kRows], lse[kRows];
  };
  auto prepare = [&](Block& x, int b, int h, int blk) {
    x.h = h, x.r0 = blk * kRows, x.rows = std::min(kRows, n_rows - x.r0), x.lanes = lanes_of(x.rows);
    x.i0 = L.pos + x.r0, x.i1 = x.i0 + x.rows, x.end = std::min(x.i1, L.keys);
    x.q = L.q_of(b) + x.r0 * L.ldq + L.qh(h);
    const size_t y_at = (static_cast<size_t>(b) * n_rows + x.r0) * Cq + L.qh(h);
    x.dy = dout + y_at;
    const float* y = out + y_at;
    std::copy_n(lse + L.lse_at(b, h) + x.r0, x.rows, x.lse);
    for (int r = 0; r < x.rows; ++r) x.d[r] = dot_row(x.dy + r * Cq, y + r * Cq, hs);
    // The lanes past the rows are computed too, and dropped: keep them finite.
    std::fill(x.lse + x.rows, x.lse + x.lanes, 0.0f);
    std::fill(x.d + x.rows, x.d + x.lanes, 0.0f);
    if (pairs) {
      const size_t n = static_cast<size_t>(hs) / 2 * kRows;
      x.qt2 = thread_buffer<uint32_t>(2, n), x.dyt2 = thread_buffer<uint32_t>(3, n);
      x.q2 = thread_buffer<uint32_t>(4, n), x.dy2 = thread_buffer<uint32_t>(5, n);
      pack_transposed(x.qt2, x.q, x.rows, L.ldq, hs);
      pack_transposed(x.dyt2, x.dy, x.rows, Cq, hs);
      pack_row_pairs(x.q2, hs, x.q, L.ldq, x.rows, hs);
      pack_row_pairs(x.dy2, hs, x.dy, Cq, x.rows, hs);
    } else {
      x.qt = thread_buffer(2, static_cast<size_t>(hs) * kRows), x.dyt = thread_buffer(3, static_cast<size_t>(hs) * kRows);
      isa().transpose(x.qt, x.q, x.rows, L.ldq, hs);
      isa().transpose(x.dyt, x.dy, x.rows, Cq, hs);
    }
    if (blk + 1 < blocks) {
      const int next = std::min(kRows, n_rows - x.r0 - kRows);
      prefetch_rows(x.q + kRows * L.ldq, next, L.ldq, hs);
      prefetch_rows(x.dy + kRows * Cq, next, Cq, hs);
      prefetch_rows(y + kRows * Cq, next, Cq, hs);
    }
  };
  // A block against the chunk of keys from c0 of its sequence `b`: the scores and probabilities
  // again, dS^T, and whichever gradients are asked for. dV and dK (of the key/value head, rows of
  // the chunk) add the block's share; the keys the block holds itself meet their first query here,
  // so the group's first head writes those (dK and dV start unset). dQ (rows of the block) is
  // written by the first chunk and added to by the others. With `accumulate` all of it is added.
  auto meet = [&](const Block& x, int b, int c0, const HeadPairs& kv, bool want_kv, bool want_q) {
    const float* seq = L.kv_of(b);
    float* dseq = dkv_all + b * L.kv_seq;
    const size_t ldkv = L.ldkv;
    const int n = std::min(kKeys, x.end - c0), lanes = x.lanes, rows = x.rows;
    const float *kc = seq + c0 * ldkv + L.k(x.h), *vc = seq + c0 * ldkv + L.v(x.h);
    float *pt = thread_buffer(0, static_cast<size_t>(kKeys) * kRows), *dst = thread_buffer(1, static_cast<size_t>(kKeys) * kRows);
    // Key c0 + j meets the queries from c0 + j on: `ahead` of a key row, query i0 + i's keys are
    // those up to i0 + i.
    const int ahead = c0 - x.i0, met = std::clamp(x.i0 - c0, 0, n);
    const bool first_head = x.h % L.g == 0 && !accumulate;
    // In pairs, the softmax passes give P and dS^T along each key's row (A of P^T dY, dS^T Q), and
    // dS by pairs of keys (A of dS K): each only where its gradient is asked for.
    uint32_t *p_along = nullptr, *ds_along = nullptr, *ds_pairs = nullptr;
    if (pairs && want_kv) {
      p_along = thread_buffer<uint32_t>(0, static_cast<size_t>(kKeys) * kRows / 2);
      ds_along = thread_buffer<uint32_t>(1, static_cast<size_t>(kKeys) * kRows / 2);
    }
    if (pairs && want_q) ds_pairs = thread_buffer<uint32_t>(6, static_cast<size_t>(kKeys) / 2 * kRows);
    auto add_to_keys = [&](const float* grad_t, const float* rhs, size_t ld, const uint32_t* along, const uint32_t* rhs2, float* to) {
      if (pairs) {
        const int k = (rows + 1) / 2;
        multiply_pairs(met, hs, k, 1.0f, along, kRows / 2, 1, rhs2, hs, to + c0 * ldkv, ldkv, true, Zeros::k_before, ahead);
        multiply_pairs(n - met, hs, k, 1.0f, along + met * kRows / 2, kRows / 2, 1, rhs2, hs, to + (c0 + met) * ldkv, ldkv,
                       !first_head, Zeros::k_before, ahead + met);
        return;
      }
      multiply(met, hs, rows, 1.0f, grad_t, kRows, 1, rhs, ld, to + c0 * ldkv, ldkv, true, Zeros::k_before, ahead);
      multiply(n - met, hs, rows, 1.0f, grad_t + met * kRows, kRows, 1, rhs, ld, to + (c0 + met) * ldkv, ldkv, !first_head,
               Zeros::k_before, ahead + met);
    };
    // S^T = scale K Q^T
    if (pairs) {
      multiply_pairs(n, lanes, hs / 2, scale, kv.k_rows + c0 * hs / 2, hs / 2, 1, x.qt2, kRows, pt, kRows, false,
                     Zeros::columns_before, ahead);
    } else {
      multiply(n, lanes, hs, scale, kc, ldkv, 1, x.qt, kRows, pt, kRows, false, Zeros::columns_before, ahead);
    }
    mask_chunk(pt, n, lanes, c0, x.i0, kMasked);
    isa().probabilities_chunk(pt, n, lanes, x.lse, p_along);
    if (want_kv) add_to_keys(pt, x.dy, Cq, p_along, x.dy2, dseq + L.v(x.h));  // dV += P^T dY
    // dP^T = V dY^T
    if (pairs) {
      multiply_pairs(n, lanes, hs / 2, 1.0f, kv.v_rows + c0 * hs / 2, hs / 2, 1, x.dyt2, kRows, dst, kRows, false,
                     Zeros::columns_before, ahead);
    } else {
      multiply(n, lanes, hs, 1.0f, vc, ldkv, 1, x.dyt, kRows, dst, kRows, false, Zeros::columns_before, ahead);
    }
    mask_chunk(dst, n, lanes, c0, x.i0, 0.0f);
    isa().softmax_grad_chunk(dst, pt, n, lanes, x.d, scale, ds_along, ds_pairs);  // dS^T
    if (want_q) {
      float* dq = dq_all + b * L.q_seq + x.r0 * L.ldq + L.qh(x.h);
      const bool add = c0 > 0 || accumulate;
      if (pairs) {  // dQ (+)= dS K
        const uint32_t* k2 = kv.k_row_pairs + c0 / 2 * hs;
        multiply_pairs(rows, hs, (n + 1) / 2, 1.0f, ds_pairs, 1, kRows, k2, hs, dq, L.ldq, add, Zeros::k_after, -ahead);
      } else {
        multiply(rows, hs, n, 1.0f, dst, 1, kRows, kc, ldkv, dq, L.ldq, add, Zeros::k_after, -ahead);
      }
    }
    if (want_kv) add_to_keys(dst, x.q, L.ldq, ds_along, x.q2, dseq + L.k(x.h));  // dK += dS^T Q
  };

  if (passes == AttentionPasses::by_threads) {
    passes = B * KVH >= zeroth::cpu::num_threads() ? AttentionPasses::one : AttentionPasses::two;
  }
  if (passes == AttentionPasses::one) {
    // A task per key/value head: its query heads in order, each block against the chunks it meets.
    for_rows(static_cast<size_t>(B) * KVH, 1, [&](size_t task) {
      const int kvh = static_cast<int>(task % KVH), b = static_cast<int>(task / KVH);
      const HeadPairs kv = pairs ? pack_head(head_store(L.keys, hs, true), L, b, kvh, true) : HeadPairs{};
      Block x;
      for (int h = kvh * L.g; h < (kvh + 1) * L.g; ++h) {
        for (int blk = 0; blk < blocks; ++blk) {
          prepare(x, b, h, blk);
          for (int c0 = 0; c0 < x.end; c0 += kKeys) meet(x, b, c0, kv, true, true);
        }
      }
    });
    return;
  }
  // Fewer key/value heads than threads (a batch of one, one or a few of them): the work splits in
  // two passes with more tasks, at the cost of two more products a block and chunk. Each gradient
  // is summed in the order above, so both ways give the same bits. First dK and dV, a task per
  // chunk of keys; then dQ, a task per block of queries.
  const PackedKv kv = pairs ? pack_all(L, true) : PackedKv{};
  auto pairs_of = [&](int b, int kvh) { return pairs ? kv.at(b, kvh, KVH) : HeadPairs{}; };
  for_rows(static_cast<size_t>(B) * KVH * chunks, 1, [&](size_t task) {
    const int c = static_cast<int>(task % chunks), kvh = static_cast<int>(task / chunks % KVH),
              b = static_cast<int>(task / chunks / KVH);
    Block x;
    // The blocks from the one holding the chunk's first key's position meet it.
    for (int h = kvh * L.g; h < (kvh + 1) * L.g; ++h) {
      for (int blk = std::max(0, c * kKeys - L.pos) / kRows; blk < blocks; ++blk) {
        prepare(x, b, h, blk);
        meet(x, b, c * kKeys, pairs_of(b, kvh), true, false);
      }
    }
  });
  for_rows(static_cast<size_t>(B) * NH * blocks, 1, [&](size_t task) {
    const int blk = static_cast<int>(task % blocks), h = static_cast<int>(task / blocks % NH),
              b = static_cast<int>(task / blocks / NH);
    Block x;
    prepare(x, b, h, blk);
    for (int c0 = 0; c0 < x.end; c0 += kKeys) meet(x, b, c0, pairs_of(b, h / L.g), false, true);
  });
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int KVH, int hs, DType products) {
  blocked_forward(out, lse, interleaved(qkv, B, T, NH, KVH, hs), in_pairs(products, hs));
}

void attention_rows(float* out, float* att, const float* qkv, int pos, int n, int NH, int KVH, int hs) {
  Layout L = interleaved(qkv, 1, pos + n, NH, KVH, hs);
  L.q += static_cast<size_t>(pos) * L.ldq, L.n = n, L.pos = pos, L.lse_ld = static_cast<size_t>(n);
  blocked_forward(out, att, L, false);
}

void attention_backward(float* dqkv, const float* dout, const float* out, const float* qkv, const float* lse, int B, int T, int NH,
                        int KVH, int hs, DType products, AttentionPasses passes) {
  const size_t Cq = static_cast<size_t>(NH) * hs;
  blocked_backward(dqkv, dqkv + Cq, dout, out, lse, interleaved(qkv, B, T, NH, KVH, hs), in_pairs(products, hs), passes, false);
}

namespace {

// One sequence's n query rows against n key/value rows (AttentionBlock): the diagonal block, or one
// wholly before the queries.
Layout block_layout(const AttentionBlock& a) {
  const size_t n = static_cast<size_t>(a.n);
  return {a.q,  a.ldq, n * a.ldq,    a.kv, a.ldkv, n * a.ldkv, a.lse_ld, 1, a.n, a.n, a.diagonal ? 0 : a.n,
          a.NH, a.KVH, a.NH / a.KVH, a.hs};
}

}  // namespace

void attention_block_forward(float* out, float* lse, const AttentionBlock& a, DType products) {
  blocked_forward(out, lse, block_layout(a), in_pairs(products, a.hs));
}

void attention_block_backward(float* dq, float* dkv, const float* dout, const float* out, const float* lse, const AttentionBlock& a,
                              DType products, AttentionPasses passes) {
  blocked_backward(dq, dkv, dout, out, lse, block_layout(a), in_pairs(products, a.hs), passes, true);
}
}  // namespace zeroth::gpt::cpu
