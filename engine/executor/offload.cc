// The executor's offload actions: reduced gradients to the host (and on to their swap file), the
// swap of a sub-group's state between its files and a host slot, and the upload of updated
// parameters to the device shard. Ordering is by events: a slot is read into only after its last
// write-back and upload are done; an update waits for its slot's read.
#include <algorithm>  // std::min
#include <chrono>     // std::chrono::steady_clock
#include <cstring>    // std::memcpy
#include <span>       // std::span
#include <utility>    // std::exchange

#include "core/cpu/kernels.h"  // cpu::axpy, cpu::cast, cpu::fill, cpu::sum_squares
#include "core/error.h"        // ZEROTH_CHECK
#include "engine/executor/executor.h"
#include "offload/aligned_buffer.h"  // AlignedBuffer, kIoAlignment

namespace zeroth {
namespace {

// The state arrays a swap slot holds, in order: master, the optimizer's moments, the gradients.
int slot_array_index(StateKind kind, int state_arrays) {
  switch (kind) {
    case StateKind::master: return 0;
    case StateKind::moment0: return 1;
    case StateKind::moment1: return 2;
    case StateKind::grad_shard: return 1 + state_arrays;
    default: break;
  }
  ZEROTH_THROW(InvalidArgument, "{} has no place in a swap slot", state_kind_name(kind));
}

// Adds the squares of x[at, at + n) (f32, or a narrow type widened exactly a sum's chunk at a
// time, so whole chunks skip the sum's carry).
void add_squares(cpu::SegmentedSumSquares& sum, const void* x, DType type, size_t at, size_t n) {
  if (type == DType::f32) return sum.add(static_cast<const float*>(x) + at, n);
  thread_local std::vector<float> wide(cpu::kChunkElements);
  for (size_t i = 0; i < n; i += wide.size()) {
    const size_t m = std::min(wide.size(), n - i);
    cpu::cast(static_cast<const char*>(x) + (at + i) * dtype_size(type), type, wide.data(), DType::f32, m);
    sum.add(wide.data(), m);
  }
}

}  // namespace

void Executor::drain_swaps() {
  // A delayed update runs on under the next cycle: only what the step published is waited for.
  if (!pending_) {
    for (Stream* s : {swap_in_stream_.get(), update_stream_.get(), swap_out_stream_.get()})
      if (s != nullptr) s->synchronize();
  }
  if (gather_stream_) gather_stream_->synchronize();
  check_io();
}

namespace {

// Waits for every handle, then raises the first failure: a buffer is reused only once no
// transfer into or out of it is left in flight.
void wait_all(std::span<offload::IoHandle> handles) {
  std::exception_ptr first;
  for (auto& h : handles) {
    try {
      h.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace

void* Executor::state_at(StateKind kind, int block, size_t element, int sub_group, int slot) const {
  const auto& r = plan_.range(kind, block);
  if (buffers_[r.buffer]) return at(r, element);
  const size_t arrays = 2 + static_cast<size_t>(config_.optimizer.state_arrays());
  const size_t pos = r.offset + element - r.lo;
  float* base = buffers_[plan_.swap_slots].as<float>() +
                (slot * arrays + static_cast<size_t>(slot_array_index(kind, config_.optimizer.state_arrays()))) * plan_.slot_numel;
  // Every array has room for f32; narrow gradients take the front of theirs.
  return reinterpret_cast<char*>(base) + (pos - plan_.sub_group_extent[sub_group][0]) * dtype_size(plan_.buffers[r.buffer].dtype);
}

void* Executor::param_out_at(int sub_group, int slot, const OwnedRange& master, size_t element) const {
  if (plan_.param_out < 0) return nullptr;
  const size_t pos = master.offset + element - master.lo;
  // Delayed: the whole offloaded shard, where the owned layout puts it (every sub-group is offloaded).
  if (plan_.delayed_update) return static_cast<char*>(buffers_[plan_.param_out].data()) + pos * dtype_size(plan_.compute_dtype);
  return static_cast<char*>(buffers_[plan_.param_out].data()) +
         (slot * plan_.slot_numel + pos - plan_.sub_group_extent[sub_group][0]) * dtype_size(plan_.compute_dtype);
}

// Long: one bucket's way to the host: the waits, the loop over pieces and the host callback that casts or adds, takes the
// squares and writes; the callback uses the loop's pieces and double buffer, so it stays beside them.
void Executor::offload_grads(int index, bool add, Stream& rs) {
  const auto& bucket = plan_.reduce_buckets[index];
  const TensorView landed = landing_[index];
  const size_t n = landed.numel;
  // A delayed update still running may not have read the last step's gradients yet. Published
  // sub-group by sub-group, the last step's update has read them once it uploaded (this cycle's
  // gathers of the bucket's blocks waited for that already).
  if (plan_.delayed_update) {
    for (int g : bucket_sub_groups_[index]) rs.wait(*grads_read_[g]);
  } else if (plan_.publish_by_sub_group) {
    for (int g : bucket_sub_groups_[index])
      if (plan_.sub_group_offloaded(g)) rs.wait(*published_[g]);
  }
  const OwnedRange& first = plan_.range(StateKind::grad_shard, bucket.blocks.front());
  offload::SwapFile* file = swaps_.file(first.buffer);
  // What the gradients are kept in: f32, or in their file the reduction's dtype where that is exact.
  const DType kept = plan_.buffers[first.buffer].dtype;
  const size_t kept_size = dtype_size(kept);
  const DType comm = landed.dtype;
  ZEROTH_CHECK(kept == DType::f32 || (!add && kept == comm), "offload_grads: bucket {} {} gradients reduced in {} into {}", index,
               add ? "adds" : "casts", dtype_name(comm), dtype_name(kept));
  ZEROTH_CHECK(file == nullptr || plan_.buffers[plan_.grad_host].dtype == kept, "offload_grads: grad_host is {}, the file {}",
               dtype_name(plan_.buffers[plan_.grad_host].dtype), dtype_name(kept));
  const uint64_t file_offset = first.offset * kept_size;
  const size_t comm_size = dtype_size(comm);
  double* sumsq = &bucket_sumsq_[index];
  // The squares of the counted ranges, taken as the pieces pass: bit-identical to one sum_squares
  // per range (the in-device step's), whatever the pieces.
  struct Squares {
    std::vector<std::array<size_t, 2>> counted;
    size_t next = 0;  // the first range not yet finished
    cpu::SegmentedSumSquares range;
    double total = 0.0;
  };
  const auto squares = std::make_shared<Squares>();
  squares->counted = plan_.bucket_counted_in_norm(index);
  // Piece by piece (Plan::grad_piece_numel): the device copy of a piece, then on the host its cast
  // (or sum with what the file holds, for a later micro-batch) and its write, which runs on while
  // the next piece is copied and cast. The squares are taken on the way, so the step's norm never
  // reads the gradients back; the last micro-batch's pass leaves the final ones.
  const size_t piece = plan_.grad_piece_numel;
  const size_t pieces = (n + piece - 1) / piece;
  void* staging = buffers_[plan_.grad_staging].data();
  for (size_t k = 0; k < pieces; ++k) {
    const size_t lo = k * piece, len = std::min(piece, n - lo);
    device_.copy(rs, staging, static_cast<const char*>(landed.data) + lo * comm_size, len * comm_size);
    void* host = file != nullptr ? static_cast<char*>(buffers_[plan_.grad_host].data()) + (k % 2) * piece * kept_size
                                 : static_cast<char*>(at(first, first.lo)) + lo * kept_size;
    const bool last = k + 1 == pieces;
    rs.enqueue_host([=, this] {
      try {
        const size_t bytes = offload::round_up_to_io(len * kept_size);
        const uint64_t offset = file_offset + lo * kept_size;
        offload::IoHandle& pending = grad_writes_[k % 2];
        if (file != nullptr) swaps_.timed(0, 0, [&] { std::exchange(pending, {}).wait(); });  // the buffer's previous write
        if (add) {
          if (file != nullptr) swaps_.timed(bytes, 0, [&] { file->read(host, bytes, offset).wait(); });
          cpu::axpy(host, DType::f32, 1.0f, staging, comm, len);
        } else {
          cpu::cast(staging, comm, host, kept, len);
        }
        for (Squares& sq = *squares; sq.next < sq.counted.size() && sq.counted[sq.next][0] < lo + len; ++sq.next) {
          const auto [a, b] = sq.counted[sq.next];
          const size_t from = std::max(a, lo), to = std::min(b, lo + len);
          add_squares(sq.range, host, kept, from - lo, to - from);
          if (b > lo + len) break;  // goes on in the next piece
          sq.total += sq.range.finish();
        }
        if (last) *sumsq = squares->total;
        if (file == nullptr) return;
        swaps_.timed(0, bytes, [&] { pending = file->write(host, bytes, offset); });
        // The bucket's gradients are in their file when its last callback returns (reduced_).
        if (last) {
          swaps_.timed(0, 0, [&] { wait_all(grad_writes_); });
          grad_writes_ = {};
        }
      } catch (...) {
        // A failed piece ends the bucket (later callbacks may not run): no write of its other
        // pieces may still be in flight when the error surfaces. The first error is the one kept.
        for (auto& h : grad_writes_) {
          try {
            h.wait();
          } catch (...) {
          }
        }
        grad_writes_ = {};
        throw;
      }
    });
  }
  reduced_ = record(rs);
  for (int b : bucket.blocks) grad_reader_[b] = reduced_;
}

// See [Note: swap slots] in docs/ARCHITECTURE.md.
void Executor::swap_in(int sub_group, int slot) {
  Stream& ss = *swap_in_stream_;
  ss.wait(*slot_written_[slot]);
  ss.wait(*slot_uploaded_[slot]);
  // The gradients are in their file once the bucket's offload_grads is done (during the backward
  // pass, the one just issued).
  if (reduced_) ss.wait(*reduced_);
  const int b = plan_.sub_groups[sub_group].front().block;
  // Named, not a structured binding: the lambdas below capture them (clang before 16 cannot).
  const size_t lo = plan_.sub_group_extent[sub_group][0], hi = plan_.sub_group_extent[sub_group][1];
  struct Read {
    offload::SwapFile* file;
    void* into;
    uint64_t offset;
    size_t bytes;
  };
  std::vector<Read> reads;
  for (StateKind kind : {StateKind::master, StateKind::moment0, StateKind::moment1, StateKind::grad_shard}) {
    const auto* r = plan_.find(kind, b);
    if (r == nullptr) continue;
    ZEROTH_CHECK(swaps_.file(r->buffer) != nullptr, "swap_in: {} is not in a swap file", state_kind_name(kind));
    reads.push_back({swaps_.file(r->buffer), state_at(kind, b, r->lo + (lo - r->offset), sub_group, slot),
                     swaps_.offset(r->buffer, sub_group, lo),
                     offload::round_up_to_io((hi - lo) * dtype_size(plan_.buffers[r->buffer].dtype))});
  }
  uint64_t bytes = 0;
  for (const auto& r : reads) bytes += r.bytes;
  ss.enqueue_host([reads, bytes, this] {
    swaps_.timed(
        bytes, 0,
        [&] {
      std::vector<offload::IoHandle> handles;
      for (const auto& r : reads) handles.push_back(r.file->read(r.into, r.bytes, r.offset));
      wait_all(handles);
        },
        true);
  });
  slot_ready_[slot]->record(ss);
}

void Executor::swap_out(int sub_group, int slot, bool speculative) {
  Stream& ws = *swap_out_stream_;
  ws.wait(*record(*update_stream_));
  const int b = plan_.sub_groups[sub_group].front().block;
  // Named, not a structured binding: the lambdas below capture them (clang before 16 cannot).
  const size_t lo = plan_.sub_group_extent[sub_group][0], hi = plan_.sub_group_extent[sub_group][1];
  struct Write {
    offload::SwapFile* file;
    const void* from;
    uint64_t offset;
  };
  std::vector<Write> writes;
  bool two_copies = false;
  // The gradients are not written back: the next cycle replaces them.
  for (StateKind kind : {StateKind::master, StateKind::moment0, StateKind::moment1}) {
    const auto* r = plan_.find(kind, b);
    if (r == nullptr) continue;
    two_copies = two_copies || plan_.buffers[r->buffer].two_copies;
    writes.push_back({swaps_.file(r->buffer), state_at(kind, b, r->lo + (lo - r->offset), sub_group, slot),
                      swaps_.offset(r->buffer, sub_group, lo, true)});
  }
  ws.enqueue_host([writes, lo, hi, this] {
    const size_t bytes = offload::round_up_to_io((hi - lo) * sizeof(float));
    swaps_.timed(
        0, bytes * writes.size(),
        [&] {
      std::vector<offload::IoHandle> handles;
      for (const auto& w : writes) handles.push_back(w.file->write(w.from, bytes, w.offset));
      wait_all(handles);
        },
        true);
  });
  slot_written_[slot]->record(ws);
  // Reads enqueued from now on see the new copy: the next one of this sub-group's slot waits for
  // this write (slot_written_).
  if (two_copies) {
    if (speculative) speculated_[sub_group] = true;
    else swaps_.flip(sub_group);
  }
}

void Executor::upload(int sub_group, int slot) {
  // After the update, on its stream.
  Stream& us = *update_stream_;
  const size_t c = dtype_size(plan_.compute_dtype);
  const auto& spans = plan_.sub_groups[sub_group];
  const auto& first = plan_.range(StateKind::param_shard, spans.front().block);
  if (offload::SwapFile* file = swaps_.file(first.buffer)) {
    // Parameter shards in a swap file (stage 3): the sub-group's extent is one write, as the
    // shard and the optimizer state share the owned layout (the file from the owned space's start,
    // the extent from the offloaded part's).
    const auto [lo, hi] = plan_.sub_group_extent[sub_group];
    const size_t at = (lo + plan_.device_owned) * c;
    const auto& master = plan_.range(StateKind::master, spans.front().block);
    const void* from = plan_.param_out >= 0 ? param_out_at(sub_group, slot, master, spans.front().lo)
                                            : state_at(StateKind::master, spans.front().block, spans.front().lo, sub_group, slot);
    const size_t bytes = offload::round_up_to_io((hi - lo) * c);
    us.enqueue_host([=, this] {
      swaps_.timed(
          0, bytes, [&] { file->write(from, bytes, at).wait(); }, true);
    });
    slot_uploaded_[slot]->record(us);
    if (plan_.publish_by_sub_group) published_[sub_group]->record(us);
    return;
  }
  // Spans of one block that touch are one copy.
  for (size_t i = 0; i < spans.size();) {
    size_t j = i + 1;
    while (j < spans.size() && spans[j].block == spans[i].block && spans[j].lo == spans[j - 1].hi) ++j;
    const int b = spans[i].block;
    const size_t lo = spans[i].lo, hi = spans[j - 1].hi;
    const auto& master = plan_.range(StateKind::master, b);
    const void* from = plan_.param_out >= 0 ? param_out_at(sub_group, slot, master, lo)
                                            : state_at(StateKind::master, b, lo, sub_group, slot);
    device_.copy(us, at(plan_.range(StateKind::param_shard, b), lo), from, (hi - lo) * c);
    i = j;
  }
  slot_uploaded_[slot]->record(us);
  if (plan_.publish_by_sub_group) published_[sub_group]->record(us);
}

void Executor::wait_published(Stream& s, int block) {
  if (!plan_.publish_by_sub_group) return;
  for (int g : block_sub_groups_[block]) s.wait(*published_[g]);
}

void Executor::gather_shards(Stream& gs, int block, TensorView full) {
  wait_published(gs, block);
  const auto& r = plan_.range(StateKind::param_shard, block);
  if (on_device(r.buffer)) {
    gather_comm(block).all_gather(gs, view(StateKind::param_shard, block), full);
    return;
  }
  // This rank's slice of `full` receives the shard; the all-gather then runs in place.
  const TensorView mine = full.slice(r.lo, r.numel());
  if (offload::SwapFile* file = swaps_.file(r.buffer)) {
    void* staging = buffers_[plan_.param_staging].data();
    const size_t bytes = mine.bytes(), offset = r.offset * dtype_size(mine.dtype);
    gs.enqueue_host([=, this] {
      swaps_.timed(offload::round_up_to_io(bytes), 0, [&] { file->read(staging, offload::round_up_to_io(bytes), offset).wait(); });
    });
    device_.copy(gs, mine.data, staging, bytes);
  } else {
    device_.copy(gs, mine.data, at(r, r.lo), mine.bytes());
  }
  gather_comm(block).all_gather(gs, mine, full);
}

}  // namespace zeroth
