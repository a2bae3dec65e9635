// Ring attention (context parallelism; Liu et al. 2023, as torchtitan and Megatron's context
// parallelism run it): the C ranks of a context group each hold two of a sample's 2C chunks of
// positions, rank r chunks r and 2C-1-r (the zigzag split: every rank then has the same causal
// work). Each rank's keys and values travel around the ring while its queries attend to each block
// as it passes, merged by the online softmax; the backward sends them round again with their
// gradient, which reaches its owner after the last rank added its share.
//
// The exchanges run on a stream of their own: step s + 1's keys and values (and step s - 1's
// gradient) move while step s computes. Enqueued between the kernels' work on the compute stream, as
// SequenceGroup's all-to-alls; a group of one rank does nothing and is never called.
#pragma once

#include <array>       // std::array
#include <atomic>      // std::atomic
#include <cstddef>     // size_t
#include <cstdint>     // int64_t
#include <functional>  // std::function
#include <vector>      // std::vector

#include "comm/communicator.h"       // Communicator
#include "core/device.h"             // Event, Stream
#include "models/decoder/dims.h"     // Dims
#include "models/kernels/kernels.h"  // gpt::Kernels

namespace zeroth::gpt {

// One block of a step's work: this rank's chunk in slot `q` (0: chunk r, 1: chunk 2C-1-r) against
// the travelling keys' chunk in slot `k` (those of rank (r - step) mod C, in the same order), the
// diagonal one (its own chunk) or one wholly before the queries.
struct RingBlock {
  int q, k;
  bool diagonal;
};
// The sample's chunk held in `slot` by rank r of C.
inline int ring_chunk(int C, int r, int slot) { return slot == 0 ? r : 2 * C - 1 - r; }
// Step `step`'s blocks on rank r (keys from rank (r - step) mod C): those a causal attention needs.
std::vector<RingBlock> ring_blocks(int C, int r, int step);

// The ring's scratch (Dims::ring_floats): two key/value buffers of every row of the rank's samples
// (the one in use, the next arriving), three for their gradients (the one being added to, the one
// sent on, the one arriving), one block's output and log-sum-exp.
struct RingScratch {
  float *kv[2], *dkv[3], *out, *lse;
};

class ContextRing {
 public:
  // `exchange`: the stream the ring's sends run on (null: the compute stream), with three events for
  // the hand-overs (RingEvents). With `nanos`, the time the compute stream waits for an exchange is
  // added there.
  ContextRing(Communicator* comm, Kernels& k, Stream& stream, Stream* exchange, std::array<Event*, 3> events, const Dims& dims,
              RingScratch scratch, std::atomic<int64_t>* nanos = nullptr)
      : comm_(comm), k_(k), stream_(stream), exchange_(exchange), events_(events), d_(dims), s_(scratch), nanos_(nanos) {}
  bool active() const { return d_.cp > 1; }
  // The dtype of the attention's products, asked in stream order (the weights' binding says it).
  using Products = std::function<DType()>;
  // qkv [B, T, W] this rank's rows (T = 2c: its two chunks of each sample); out [B, T, Cq] and lse
  // [B, NH, T] over every key the rows see.
  void forward(const float* qkv, float* out, float* lse, int B, int T, const Products& products) const;
  // dqkv [B, T, W] from dout and the forward's out and lse.
  void backward(float* dqkv, const float* dout, const float* out, const float* qkv, const float* lse, int B, int T,
                const Products& products) const;

 private:
  // The events: the compute stream's work marked for the next shift to wait for, the keys' and values'
  // arrival, their gradient's.
  enum Which { made, kv_moved, dkv_moved };
  // Marks the compute stream's work so far: what the next shift waits for.
  void mark() const;
  // Moves `n` floats of `send` to the next rank of the ring and the previous rank's into `recv`, on
  // the exchange stream after the work marked last; `moved` records its end. The backend checks the
  // counts agree (a peer sending another count is an error there).
  void shift(const float* send, float* recv, size_t n, Which moved) const;
  // The compute stream waits for the shift that recorded `moved` last.
  void wait_for(Which moved) const;
  // This rank's keys and values [B, T, 2 KVH hs] out of its qkv rows.
  void pack_kv(const float* qkv, float* kv, int B, int T) const;

  Communicator* comm_;
  Kernels& k_;
  Stream& stream_;
  Stream* exchange_;
  std::array<Event*, 3> events_;
  Dims d_;
  RingScratch s_;
  std::atomic<int64_t>* nanos_;
};

}  // namespace zeroth::gpt
