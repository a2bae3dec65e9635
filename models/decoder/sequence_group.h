// Ulysses sequence parallelism's exchanges around the attention (DeepSpeed-Ulysses, Jacobs et al.
// 2023): each rank of the group holds T positions of every sample; an all-to-all before the
// attention hands each rank all T sq positions of its share of the heads, and one after it hands the
// attention's output back by positions. Enqueued on the compute stream between the kernels' work
// (as TensorGroup's collectives); a group of one rank does nothing and is never called.
#pragma once

#include <atomic>   // std::atomic
#include <cstddef>  // size_t
#include <cstdint>  // int64_t

#include "comm/communicator.h"            // Communicator
#include "models/decoder/context_ring.h"  // ContextRing
#include "core/device.h"                  // Stream
#include "models/decoder/dims.h"          // Dims
#include "models/kernels/kernels.h"       // gpt::Kernels

namespace zeroth::gpt {

// Layouts: a rank's rows are [B, T, width] (its positions of each sample, every head); its heads are
// [B, T sq, width'] (every position of each sample, its heads: Dims::NHa, KVHa).
class SequenceGroup {
 public:
  // send and recv: scratch of BT sq Wa floats each (Dims::ulysses_floats), the same buffer for one
  // sample (B = 1: every exchange then packs into one and sends from or receives into the heads). With `nanos`, each
  // exchange's time on the stream (from when the stream reaches it to when it is done, the wait for
  // the group's slowest rank included) is added there.
  SequenceGroup(Communicator* comm, Kernels& k, Stream& stream, const Dims& dims, float* send, float* recv,
                std::atomic<int64_t>* nanos = nullptr, const ContextRing* ring = nullptr)
      : comm_(comm), k_(k), stream_(stream), d_(dims), send_(send), recv_(recv), nanos_(nanos), ring_(ring) {}
  bool active() const { return d_.sq > 1; }
  // The context group's ring, where the part's positions split that way instead (null: they do not).
  const ContextRing* ring() const { return ring_ != nullptr && ring_->active() ? ring_ : nullptr; }
  // q, k, v rows [B, T, W] into heads [B, T sq, Wa].
  void qkv_to_heads(const float* rows, float* heads, int B, int T) const;
  // The gradient at the heads back at the rows; a replicated key/value head's gradients are summed.
  void qkv_grad_to_rows(const float* heads, float* rows, int B, int T) const;
  // The attention's output, heads [B, T sq, Cqa], into rows [B, T, Cq].
  void out_to_rows(const float* heads, float* rows, int B, int T) const;
  // The gradient at those rows into the heads' layout.
  void out_grad_to_heads(const float* rows, float* heads, int B, int T) const;

 private:
  // Heads [B, T sq, w] and the all-to-all's chunks [sq][B, T, w] (chunk u: rank u's positions),
  // both ways; B = 1 needs no copy (the chunks are the heads' rows).
  void heads_to_chunks(const float* heads, float* chunks, int B, int T, size_t w) const;
  void chunks_to_heads(const float* chunks, float* heads, int B, int T, size_t w) const;
  void exchange(const float* send, float* recv, size_t n) const;

  Communicator* comm_;
  Kernels& k_;
  Stream& stream_;
  Dims d_;
  float *send_, *recv_;
  std::atomic<int64_t>* nanos_;
  const ContextRing* ring_;
};

}  // namespace zeroth::gpt
