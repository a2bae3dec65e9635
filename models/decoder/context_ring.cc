// Ring attention's steps and the sends between them.
#include "models/decoder/context_ring.h"

#include <chrono>  // std::chrono::steady_clock
#include <memory>  // std::make_shared

namespace zeroth::gpt {

std::vector<RingBlock> ring_blocks(int C, int r, int step) {
  const int from = ((r - step) % C + C) % C;
  std::vector<RingBlock> blocks;
  // Each query chunk's diagonal block comes first: step 0 writes the chunk's output with it, and the
  // blocks after merge into that.
  for (int q = 0; q < 2; ++q) {
    if (step == 0) blocks.push_back({q, q, true});
  }
  for (int q = 0; q < 2; ++q) {
    for (int k = 0; k < 2; ++k) {
      if (ring_chunk(C, from, k) < ring_chunk(C, r, q)) blocks.push_back({q, k, false});
    }
  }
  return blocks;
}

void ContextRing::mark() const {
  if (exchange_ != nullptr) events_[made]->record(stream_);
}

void ContextRing::shift(const float* send, float* recv, size_t n, Which moved) const {
  Stream& x = exchange_ != nullptr ? *exchange_ : stream_;
  if (exchange_ != nullptr) x.wait(*events_[made]);
  const int C = d_.cp, next = (d_.cp_rank + 1) % C, previous = (d_.cp_rank + C - 1) % C;
  // Point to point, even ranks sending first and odd ones receiving first: a backend whose send
  // waits for the matching receive (the local one holds this thread until the peer posts it) then
  // never has every rank of the ring waiting to send, whatever C's parity.
  const TensorView out{const_cast<float*>(send), n, DType::f32}, in{recv, n, DType::f32};
  if (d_.cp_rank % 2 == 0) {
    comm_->send(x, out, next);
    comm_->recv(x, in, previous);
  } else {
    comm_->recv(x, in, previous);
    comm_->send(x, out, next);
  }
  if (exchange_ != nullptr) events_[moved]->record(x);
}

void ContextRing::wait_for(Which moved) const {
  if (exchange_ == nullptr) return;
  if (nanos_ == nullptr) return stream_.wait(*events_[moved]);
  using Clock = std::chrono::steady_clock;
  auto start = std::make_shared<Clock::time_point>();
  stream_.enqueue_host([start] { *start = Clock::now(); });
  stream_.wait(*events_[moved]);
  stream_.enqueue_host(
      [start, nanos = nanos_] { *nanos += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - *start).count(); });
}

void ContextRing::pack_kv(const float* qkv, float* kv, int B, int T) const {
  k_.submit([k = &k_, d = d_, qkv, kv, rows = static_cast<size_t>(B) * T] {
    const size_t Wkv = 2 * static_cast<size_t>(d.KVH) * d.hs;
    k->copy_columns(kv, Wkv, qkv + d.Cq, d.W, rows, Wkv, false);
  });
}

namespace {

// Where block `blk` of sample b lies among the rank's T rows (two chunks of c): its queries' first
// row, its keys' first row (in the travelling buffer's rows, laid out alike), and the queries'
// log-sum-exp in lse [B, NH, T].
struct BlockRows {
  size_t q, k, lse;
};
BlockRows rows_of(const Dims& d, int b, int T, int c, const RingBlock& blk) {
  const size_t first = static_cast<size_t>(b) * T;
  return {first + static_cast<size_t>(blk.q) * c, first + static_cast<size_t>(blk.k) * c,
          first * d.NH + static_cast<size_t>(blk.q) * c};
}

}  // namespace

void ContextRing::forward(const float* qkv, float* out, float* lse, int B, int T, const Products& products) const {
  const int C = d_.cp, r = d_.cp_rank, c = T / 2;
  const size_t Wkv = 2 * static_cast<size_t>(d_.KVH) * d_.hs, n = static_cast<size_t>(B) * T * Wkv;
  pack_kv(qkv, s_.kv[0], B, T);
  for (int step = 0; step < C; ++step) {
    const float* kv = s_.kv[step % 2];
    // The next keys' send runs under the step's work: it waits for the work before it (which read the
    // buffer it fills), and is enqueued after the step's (a backend may hold this thread in the send
    // until the peers reach it).
    mark();
    k_.submit([k = &k_, d = d_, s = s_, qkv, out, lse, kv, B, T, c, Wkv, products, blocks = ring_blocks(C, r, step)] {
      const size_t W = d.W, Cq = d.Cq, lse_ld = static_cast<size_t>(T);
      for (int b = 0; b < B; ++b) {
        for (const RingBlock& blk : blocks) {
          const BlockRows at = rows_of(d, b, T, c, blk);
          AttentionBlock a{qkv + at.q * W, W, kv + at.k * Wkv, Wkv, c, d.NH, d.KVH, d.hs, blk.diagonal, lse_ld};
          float *o = out + at.q * Cq, *l = lse + at.lse;
          if (blk.diagonal) {
            k->attention_block_forward(o, l, a, products());
            continue;
          }
          a.lse_ld = static_cast<size_t>(c);
          k->attention_block_forward(s.out, s.lse, a, products());
          k->attention_merge(o, l, s.out, s.lse, c, d.NH, d.hs, lse_ld);
        }
      }
    });
    if (step + 1 == C) break;
    shift(kv, s_.kv[(step + 1) % 2], n, kv_moved);
    wait_for(kv_moved);
  }
}

void ContextRing::backward(float* dqkv, const float* dout, const float* out, const float* qkv, const float* lse, int B, int T,
                           const Products& products) const {
  const int C = d_.cp, r = d_.cp_rank, c = T / 2;
  const size_t Wkv = 2 * static_cast<size_t>(d_.KVH) * d_.hs, n = static_cast<size_t>(B) * T * Wkv;
  pack_kv(qkv, s_.kv[0], B, T);
  k_.submit([k = &k_, dqkv, rows = static_cast<size_t>(B) * T, W = static_cast<size_t>(d_.W)] { k->zero(dqkv, rows * W); });
  // dkv[i % 2] gathers step i's share of the travelling keys' gradient; what the ranks before added
  // arrives in dkv[2] meanwhile, and joins it after the step.
  for (int step = 0; step < C; ++step) {
    const float* kv = s_.kv[step % 2];
    float* dkv = s_.dkv[step % 2];
    if (step > 0) wait_for(kv_moved);  // the step's keys and values are here
    mark();                            // the next ones' send runs under the step, as the forward's
    k_.submit([k = &k_, d = d_, dqkv, dkv, dout, out, qkv, lse, kv, B, T, c, Wkv, n, products, blocks = ring_blocks(C, r, step)] {
      k->zero(dkv, n);
      const size_t W = d.W, Cq = d.Cq;
      for (int b = 0; b < B; ++b) {
        for (const RingBlock& blk : blocks) {
          const BlockRows at = rows_of(d, b, T, c, blk);
          const AttentionBlock a{qkv + at.q * W, W, kv + at.k * Wkv, Wkv, c, d.NH, d.KVH, d.hs, blk.diagonal, static_cast<size_t>(T)};
          k->attention_block_backward(dqkv + at.q * W, dkv + at.k * Wkv, dout + at.q * Cq, out + at.q * Cq, lse + at.lse, a,
                                      products());
        }
      }
    });
    if (step + 1 < C) shift(kv, s_.kv[(step + 1) % 2], n, kv_moved);
    if (step > 0) {
      // The ranks before this one added theirs to these keys' gradient: it joins this step's share.
      wait_for(dkv_moved);
      k_.submit([k = &k_, dkv, from = s_.dkv[2], n] { k->accumulate(dkv, from, n); });
    }
    // On to the next rank (after the last step, the keys' owner), under the next step's work.
    mark();
    shift(dkv, s_.dkv[2], n, dkv_moved);
  }
  wait_for(dkv_moved);
  k_.submit([k = &k_, d = d_, dqkv, from = s_.dkv[2], rows = static_cast<size_t>(B) * T, Wkv] {
    k->copy_columns(dqkv + d.Cq, d.W, from, Wkv, rows, Wkv, false);
  });
}

}  // namespace zeroth::gpt
