// The tensor-parallel group's collectives of a block use (Megatron-LM's split: layers.h), enqueued
// on the compute stream between the kernels' work. A group of one rank does none.
#pragma once

#include <cstddef>  // size_t

#include "comm/communicator.h"    // Communicator, ReduceOp
#include "core/device.h"          // Stream
#include "models/decoder/dims.h"  // Dims

namespace zeroth::gpt {

// The collectives of a block use, enqueued on the compute stream between the kernels' work.
class TensorGroup {
 public:
  TensorGroup(Communicator* comm, Stream& stream, const Dims& dims) : comm_(comm), stream_(stream), dims_(dims) {}
  // Partial sums [BT, C] in `partial` become their sum: in `partial` (all-reduce), or this rank's
  // rows of it in `rows` (reduce-scatter, sequence parallel).
  void reduce(float* partial, float* rows, size_t BT) const;
  // Sequence parallel: the ranks' rows of `whole` [BT, C] (this rank's already in place) gathered.
  void gather(float* whole, size_t BT) const;
  // This rank's rows of a gradient at `rows` gathered into `whole` (the same pointer without
  // sequence parallelism, where every rank holds every row): the input of the row-parallel
  // linears' backward.
  const float* gathered_rows(const float* rows, float* whole, size_t BT) const;
  void all_reduce(float* x, size_t n, ReduceOp op) const;
  // A whole [BT, C] that every rank computed alike (not a partial sum): this rank's rows of it in
  // `rows` (sequence parallel), or already in place (the same pointer).
  void keep_rows(const float* whole, float* rows, size_t BT) const;
  const Dims& dims() const { return dims_; }

 private:
  Communicator* comm_;
  Stream& stream_;
  Dims dims_;
};

}  // namespace zeroth::gpt
