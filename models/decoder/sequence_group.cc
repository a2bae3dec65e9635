// Ulysses' all-to-alls and the packing around them.
#include "models/decoder/sequence_group.h"

#include <chrono>  // std::chrono::steady_clock
#include <memory>  // std::make_shared

namespace zeroth::gpt {

namespace {

// Rank j's q, k, v columns in the rows (`from`, width) and in its heads (`to`).
struct Segment {
  size_t from, to, width;
};
void qkv_segments(const Dims& d, int j, Segment out[3]) {
  const size_t hs = d.hs, kv = static_cast<size_t>(d.KVHa) * hs, first = static_cast<size_t>(d.kv_first(j)) * hs;
  out[0] = {static_cast<size_t>(j) * d.Cqa, 0, static_cast<size_t>(d.Cqa)};
  out[1] = {static_cast<size_t>(d.Cq) + first, static_cast<size_t>(d.Cqa), kv};
  out[2] = {static_cast<size_t>(d.Cq) + static_cast<size_t>(d.KVH) * hs + first, d.Cqa + kv, kv};
}

}  // namespace

void SequenceGroup::exchange(const float* send, float* recv, size_t n) const {
  if (nanos_ == nullptr) {
    comm_->all_to_all(stream_, {const_cast<float*>(send), n, DType::f32}, {recv, n, DType::f32});
    return;
  }
  using Clock = std::chrono::steady_clock;
  auto start = std::make_shared<Clock::time_point>();
  stream_.enqueue_host([start] { *start = Clock::now(); });
  comm_->all_to_all(stream_, {const_cast<float*>(send), n, DType::f32}, {recv, n, DType::f32});
  stream_.enqueue_host(
      [start, nanos = nanos_] { *nanos += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - *start).count(); });
}

void SequenceGroup::heads_to_chunks(const float* heads, float* chunks, int B, int T, size_t w) const {
  k_.submit([k = &k_, heads, chunks, B, T, w, sq = d_.sq] {
    const size_t rows = static_cast<size_t>(T) * w;
    for (int u = 0; u < sq; ++u) {
      for (int b = 0; b < B; ++b)
        k->copy(chunks + (static_cast<size_t>(u) * B + b) * rows, heads + (static_cast<size_t>(b) * sq + u) * rows, rows);
    }
  });
}

void SequenceGroup::chunks_to_heads(const float* chunks, float* heads, int B, int T, size_t w) const {
  k_.submit([k = &k_, heads, chunks, B, T, w, sq = d_.sq] {
    const size_t rows = static_cast<size_t>(T) * w;
    for (int u = 0; u < sq; ++u) {
      for (int b = 0; b < B; ++b)
        k->copy(heads + (static_cast<size_t>(b) * sq + u) * rows, chunks + (static_cast<size_t>(u) * B + b) * rows, rows);
    }
  });
}

void SequenceGroup::qkv_to_heads(const float* rows, float* heads, int B, int T) const {
  const size_t BT = static_cast<size_t>(B) * T, Wa = d_.Wa, chunk = BT * Wa;
  k_.submit([k = &k_, d = d_, send = send_, rows, BT, Wa, chunk] {
    Segment seg[3];
    for (int j = 0; j < d.sq; ++j) {
      qkv_segments(d, j, seg);
      for (const Segment& s : seg) k->copy_columns(send + j * chunk + s.to, Wa, rows + s.from, d.W, BT, s.width, false);
    }
  });
  // One sample: rank u's rows are the heads' rows [u T, (u + 1) T) already.
  float* into = B == 1 ? heads : recv_;
  exchange(send_, into, d_.sq * chunk);
  if (B > 1) chunks_to_heads(recv_, heads, B, T, Wa);
}

void SequenceGroup::qkv_grad_to_rows(const float* heads, float* rows, int B, int T) const {
  const size_t BT = static_cast<size_t>(B) * T, Wa = d_.Wa, chunk = BT * Wa;
  const float* send = heads;
  if (B > 1) heads_to_chunks(heads, send_, B, T, Wa), send = send_;
  exchange(send, recv_, d_.sq * chunk);
  // A key/value head replicated over several ranks gets the sum of their gradients.
  const bool replicated = d_.KVH % d_.sq != 0;
  k_.submit([k = &k_, d = d_, recv = recv_, rows, BT, Wa, chunk, replicated] {
    if (replicated) k->zero(rows, BT * d.W);
    Segment seg[3];
    for (int j = 0; j < d.sq; ++j) {
      qkv_segments(d, j, seg);
      for (const Segment& s : seg) k->copy_columns(rows + s.from, d.W, recv + j * chunk + s.to, Wa, BT, s.width, replicated);
    }
  });
}

void SequenceGroup::out_to_rows(const float* heads, float* rows, int B, int T) const {
  const size_t BT = static_cast<size_t>(B) * T, w = d_.Cqa, chunk = BT * w;
  const float* send = heads;
  if (B > 1) heads_to_chunks(heads, send_, B, T, w), send = send_;
  exchange(send, recv_, d_.sq * chunk);
  k_.submit([k = &k_, sq = d_.sq, Cq = d_.Cq, recv = recv_, rows, BT, w, chunk] {
    for (int j = 0; j < sq; ++j) k->copy_columns(rows + j * w, Cq, recv + j * chunk, w, BT, w, false);
  });
}

void SequenceGroup::out_grad_to_heads(const float* rows, float* heads, int B, int T) const {
  const size_t BT = static_cast<size_t>(B) * T, w = d_.Cqa, chunk = BT * w;
  k_.submit([k = &k_, sq = d_.sq, Cq = d_.Cq, send = send_, rows, BT, w, chunk] {
    for (int j = 0; j < sq; ++j) k->copy_columns(send + j * chunk, w, rows + j * w, Cq, BT, w, false);
  });
  float* into = B == 1 ? heads : recv_;
  exchange(send_, into, d_.sq * chunk);
  if (B > 1) chunks_to_heads(recv_, heads, B, T, w);
}

}  // namespace zeroth::gpt
