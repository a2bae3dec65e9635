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

std::string swap_folder(const ZeroConfig& zero, const PlannedBuffer& buffer) {
  return buffer.tag == MemTag::params ? zero.offload_param.nvme_path : zero.offload_optimizer.nvme_path;
}

namespace {

size_t round_to_io(size_t bytes) { return (bytes + offload::kIoAlignment - 1) / offload::kIoAlignment * offload::kIoAlignment; }

}  // namespace

void Executor::timed_io(uint64_t read_bytes, uint64_t write_bytes, const std::function<void()>& transfers, bool optimizer) {
  // After a failed transfer nothing more is written: a slot whose read failed holds garbage, and
  // the files must keep the last good state. The error is raised again here (on this stream) and
  // by check_io() at the step (CUDA streams keep host errors to themselves).
  if (write_bytes > 0 && io_failed_) {
    std::lock_guard lock(io_error_mutex_);
    std::rethrow_exception(io_error_);
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    transfers();
  } catch (...) {
    std::lock_guard lock(io_error_mutex_);
    if (!io_failed_) io_error_ = std::current_exception();
    io_failed_ = true;
    throw;
  }
  io_busy_ns_ += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  io_read_ += read_bytes;
  io_written_ += write_bytes;
  if (optimizer) {
    optimizer_read_ += read_bytes;
    optimizer_written_ += write_bytes;
  }
}

void Executor::check_io() const {
  if (!io_failed_) return;
  std::lock_guard lock(io_error_mutex_);
  std::rethrow_exception(io_error_);
}

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

SwapIo Executor::swap_io() const {
  return {io_read_.load(), io_written_.load(), static_cast<double>(io_busy_ns_.load()) * 1e-9, optimizer_read_.load(),
          optimizer_written_.load()};
}

uint64_t Executor::swap_disk_bytes() const {
  uint64_t disk = 0;
  for (const auto& f : files_)
    if (f) disk += f->file().allocated_bytes();  // one slot per buffer, null where it is not swapped
  return disk;
}

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
  offload::SwapFile* file = files_[first.buffer].get();
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
        const size_t bytes = round_to_io(len * kept_size);
        const uint64_t offset = file_offset + lo * kept_size;
        offload::IoHandle& pending = grad_writes_[k % 2];
        if (file != nullptr) timed_io(0, 0, [&] { std::exchange(pending, {}).wait(); });  // the buffer's previous write
        if (add) {
          if (file != nullptr) timed_io(bytes, 0, [&] { file->read(host, bytes, offset).wait(); });
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
        timed_io(0, bytes, [&] { pending = file->write(host, bytes, offset); });
        // The bucket's gradients are in their file when its last callback returns (reduced_).
        if (last) {
          timed_io(0, 0, [&] { wait_all(grad_writes_); });
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

uint64_t Executor::file_offset(int buffer, int sub_group, size_t lo, bool other_copy) const {
  const auto& pb = plan_.buffers[buffer];
  const size_t copy = pb.two_copies ? static_cast<size_t>(copy_[sub_group] ^ (other_copy ? 1 : 0)) : 0;
  return (lo + copy * (pb.numel / 2)) * dtype_size(pb.dtype);
}

std::vector<Executor::FilePiece> Executor::file_pieces(const OwnedRange& r) const {
  const auto& pb = plan_.buffers[r.buffer];
  if (!pb.two_copies) return {{r.offset, r.numel(), r.offset * dtype_size(pb.dtype)}};
  // Sub-groups tile the offloaded space in order; a range may cross several.
  std::vector<FilePiece> pieces;
  const size_t end = r.offset + r.numel();
  for (size_t g = 0; g < plan_.sub_groups.size(); ++g) {
    if (!plan_.sub_group_offloaded(static_cast<int>(g))) continue;
    const auto [lo, hi] = plan_.sub_group_extent[g];
    const size_t a = std::max(lo, r.offset), e = std::min(hi, end);
    if (a < e) pieces.push_back({a, e - a, file_offset(r.buffer, static_cast<int>(g), a)});
  }
  size_t covered = 0;
  for (const auto& piece : pieces) covered += piece.numel;
  ZEROTH_CHECK(covered == r.numel(), "the sub-groups cover {} of the {} elements of {} of block {}", covered, r.numel(),
               state_kind_name(r.kind), plan_.blocks[r.block].name);
  return pieces;
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
    ZEROTH_CHECK(files_[r->buffer] != nullptr, "swap_in: {} is not in a swap file", state_kind_name(kind));
    reads.push_back({files_[r->buffer].get(), state_at(kind, b, r->lo + (lo - r->offset), sub_group, slot),
                     file_offset(r->buffer, sub_group, lo), round_to_io((hi - lo) * dtype_size(plan_.buffers[r->buffer].dtype))});
  }
  uint64_t bytes = 0;
  for (const auto& r : reads) bytes += r.bytes;
  ss.enqueue_host([reads, bytes, this] {
    timed_io(
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
    writes.push_back({files_[r->buffer].get(), state_at(kind, b, r->lo + (lo - r->offset), sub_group, slot),
                      file_offset(r->buffer, sub_group, lo, true)});
  }
  ws.enqueue_host([writes, lo, hi, this] {
    const size_t bytes = round_to_io((hi - lo) * sizeof(float));
    timed_io(
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
    else copy_[sub_group] ^= 1;
  }
}

void Executor::upload(int sub_group, int slot) {
  // After the update, on its stream.
  Stream& us = *update_stream_;
  const size_t c = dtype_size(plan_.compute_dtype);
  const auto& spans = plan_.sub_groups[sub_group];
  const auto& first = plan_.range(StateKind::param_shard, spans.front().block);
  if (offload::SwapFile* file = files_[first.buffer].get()) {
    // Parameter shards in a swap file (stage 3): the sub-group's extent is one write, as the
    // shard and the optimizer state share the owned layout (the file from the owned space's start,
    // the extent from the offloaded part's).
    const auto [lo, hi] = plan_.sub_group_extent[sub_group];
    const size_t at = (lo + plan_.device_owned) * c;
    const auto& master = plan_.range(StateKind::master, spans.front().block);
    const void* from = plan_.param_out >= 0 ? param_out_at(sub_group, slot, master, spans.front().lo)
                                            : state_at(StateKind::master, spans.front().block, spans.front().lo, sub_group, slot);
    const size_t bytes = round_to_io((hi - lo) * c);
    us.enqueue_host([=, this] {
      timed_io(
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

void Executor::read_owned(const OwnedRange& r, void* out) {
  const size_t e = dtype_size(plan_.buffers[r.buffer].dtype);
  if (buffers_[r.buffer]) {
    Stream& cs = compute_stream();
    device_.copy(cs, out, at(r, r.lo), r.numel() * e);
    cs.synchronize();
    return;
  }
  // The last step's write-backs may still be on their way to the file; after a failed one the
  // file holds no state worth reading (a checkpoint must not save it).
  swap_out_stream_->synchronize();
  check_io();
  offload::AlignedBuffer& bounce = scratch_io_[0];
  const size_t bounce_bytes = std::min(kTransferBounceBytes, round_to_io(r.numel() * e));
  if (bounce.size() < bounce_bytes) bounce = offload::AlignedBuffer(bounce_bytes);
  // Pieces start on the files' I/O alignment (sub-groups do), and so does every bounce-sized part of one.
  for (const auto& piece : file_pieces(r)) {
    const size_t bytes = piece.numel * e;
    for (size_t done = 0; done < bytes; done += bounce.size()) {
      const size_t n = std::min(bounce.size(), bytes - done);
      files_[r.buffer]->read(bounce.data(), round_to_io(n), piece.file_offset + done).wait();
      std::memcpy(static_cast<char*>(out) + (piece.at - r.offset) * e + done, bounce.data(), n);
    }
  }
}

void Executor::release_scratch() {
  // `v = {}` would pick the initializer-list assignment, which keeps the capacity: swap it away.
  std::vector<float>().swap(scratch_values_);
  std::vector<char>().swap(scratch_narrow_);
  for (auto& bounce : scratch_io_) bounce = {};
}

size_t Executor::scratch_bytes() const {
  return scratch_values_.capacity() * sizeof(float) + scratch_narrow_.capacity() + scratch_io_[0].size() + scratch_io_[1].size();
}

void Executor::write_owned(const OwnedRange& r, const void* values) {
  OwnedWriter out(*this, r, scratch_io_[0]);
  out.add(values, r.lo, r.hi);
  out.finish();
}

Executor::OwnedWriter::OwnedWriter(Executor& exec, const OwnedRange& r, offload::AlignedBuffer& bounce)
    : exec_(exec), r_(r), bounce_(bounce), element_(dtype_size(exec.plan_.buffers[r.buffer].dtype)), next_(r.lo) {
  if (exec_.buffers_[r_.buffer]) return;
  // Nothing of this file may be in flight while it is written around the streams.
  exec_.swap_in_stream_->synchronize();
  exec_.swap_out_stream_->synchronize();
  pieces_ = exec_.file_pieces(r_);
  // A range smaller than a bounce buffer takes what it needs (and a buffer kept from a larger one).
  const size_t bytes = std::min(kTransferBounceBytes, round_to_io(r_.numel() * element_));
  if (bounce_.size() < bytes) bounce_ = offload::AlignedBuffer(bytes);
}

void Executor::OwnedWriter::add(const void* values, size_t lo, size_t hi) {
  const size_t from = std::max(lo, r_.lo), to = std::min(hi, r_.hi);
  if (from >= to) return;
  ZEROTH_CHECK(from == next_, "OwnedWriter: element {} of {} of block {} written after {}: the range goes front to back", from,
               state_kind_name(r_.kind), exec_.plan_.blocks[r_.block].name, next_);
  const char* src = static_cast<const char*>(values) + (from - lo) * element_;
  next_ = to;
  if (exec_.buffers_[r_.buffer]) {
    Stream& cs = exec_.compute_stream();
    exec_.device_.copy(cs, exec_.at(r_, from), src, (to - from) * element_);
    cs.synchronize();  // the caller reuses `values`
    return;
  }
  for (size_t count = to - from; count > 0;) {
    const FilePiece& piece = pieces_[piece_];
    const size_t take = std::min({count, piece.numel - done_, (bounce_.size() - filled_) / element_});
    std::memcpy(bounce_.data() + filled_, src, take * element_);
    filled_ += take * element_;
    done_ += take;
    src += take * element_;
    count -= take;
    if (done_ == piece.numel || filled_ == bounce_.size()) flush();
    if (done_ == piece.numel) ++piece_, done_ = 0;
  }
}

void Executor::OwnedWriter::flush() {
  if (filled_ == 0) return;
  // A piece's writes start on its aligned offset and go on in whole bounce buffers, so only its
  // last one is short; that one is padded with zeros to the I/O alignment.
  const size_t length = round_to_io(filled_);
  std::memset(bounce_.data() + filled_, 0, length - filled_);
  const FilePiece& piece = pieces_[piece_];
  exec_.files_[r_.buffer]->write(bounce_.data(), length, piece.file_offset + done_ * element_ - filled_).wait();
  filled_ = 0;
}

void Executor::OwnedWriter::finish() {
  ZEROTH_CHECK(next_ == r_.hi, "OwnedWriter: {} of block {} written up to element {} of [{}, {})", state_kind_name(r_.kind),
               exec_.plan_.blocks[r_.block].name, next_, r_.lo, r_.hi);
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
  if (offload::SwapFile* file = files_[r.buffer].get()) {
    void* staging = buffers_[plan_.param_staging].data();
    const size_t bytes = mine.bytes(), offset = r.offset * dtype_size(mine.dtype);
    gs.enqueue_host([=, this] { timed_io(round_to_io(bytes), 0, [&] { file->read(staging, round_to_io(bytes), offset).wait(); }); });
    device_.copy(gs, mine.data, staging, bytes);
  } else {
    device_.copy(gs, mine.data, at(r, r.lo), mine.bytes());
  }
  gather_comm(block).all_gather(gs, mine, full);
}

}  // namespace zeroth
