// Values in and out of the executor between cycles, whatever tier holds them: a block's values
// written to every kind this rank holds of it, owned ranges read and written whole (through a
// bounce buffer where they are in a swap file), and the master values gathered.
#include <algorithm>  // std::fill, std::min, std::max
#include <cstring>    // std::memcpy
#include <optional>   // std::optional

#include "core/cpu/kernels.h"  // cpu::cast
#include "core/error.h"        // ZEROTH_CHECK
#include "engine/executor/executor.h"
#include "offload/aligned_buffer.h"  // AlignedBuffer, round_up_to_io

namespace zeroth {

void Executor::zero_outside_params(int b, size_t lo, size_t hi, float* values) const {
  const auto& offsets = plan_.blocks[b].param_offsets;
  const auto& params = specs_[b].params;
  size_t at = lo;  // [lo, at) is a parameter's or zeroed
  for (size_t i = 0; i < params.size() && at < hi; ++i) {
    const size_t p0 = offsets[i], p1 = p0 + params[i].numel();
    if (p1 <= at) continue;
    if (p0 > at) std::fill(values + (at - lo), values + (std::min(p0, hi) - lo), 0.0f);
    at = std::max(at, p1);
  }
  if (at < hi) std::fill(values + (at - lo), values + (hi - lo), 0.0f);
}

void Executor::write_block(int b, const std::function<void(size_t, size_t, float*)>& fill) {
  const OwnedRange* params = plan_.find(StateKind::params, b);
  const OwnedRange& shard = plan_.range(StateKind::param_shard, b);
  const OwnedRange* master = plan_.find(StateKind::master, b);  // none for a frozen block
  const auto [lo, hi] = plan_.values_range(b);
  std::optional<OwnedWriter> shard_out, master_out;
  if (params == nullptr || params->buffer != shard.buffer) shard_out.emplace(*this, shard, scratch_io_[0]);
  if (master != nullptr && !same_place(*master, shard)) master_out.emplace(*this, *master, scratch_io_[1]);
  const DType dtype = plan_.compute_dtype;
  const size_t c = dtype_size(dtype);
  // Full parameters in host memory are written in place: the values themselves where they are f32,
  // else cast straight into them; a device's go through the host scratch and a copy.
  const bool host_params = params != nullptr && in_host_memory(params->buffer);
  Stream& cs = compute_stream();
  // A chunk at a time (kTransferChunkNumel): fill asks for any part of [lo, hi).
  for (size_t a = lo; a < hi; a += kTransferChunkNumel) {
    const size_t e = std::min(hi, a + kTransferChunkNumel), n = e - a;
    const bool in_place = host_params && params->lo <= a && e <= params->hi;
    float* values;
    if (in_place && c == sizeof(float)) {
      values = static_cast<float*>(at(*params, a));
    } else {
      scratch_values_.resize(n);  // not cleared: fill writes every parameter's element
      values = scratch_values_.data();
    }
    zero_outside_params(b, a, e, values);
    fill(a, e, values);
    char* narrow = reinterpret_cast<char*>(values);
    if (c != sizeof(float)) {
      if (in_place) {
        narrow = static_cast<char*>(at(*params, a));
      } else {
        scratch_narrow_.resize(n * c);
        narrow = scratch_narrow_.data();
      }
      cpu::cast(values, DType::f32, narrow, dtype, n);
    }
    if (params != nullptr && !in_place) {
      const size_t from = std::max(a, params->lo), to = std::min(e, params->hi);
      if (from < to) device_.copy(cs, at(*params, from), narrow + (from - a) * c, (to - from) * c);
      cs.synchronize();  // the copy has read `narrow`
    }
    if (shard_out) shard_out->add(narrow, a, e);
    if (master_out) master_out->add(values, a, e);
  }
  if (shard_out) shard_out->finish();
  if (master_out) master_out->finish();
}

float* Executor::values_in_place(int b) {
  const OwnedRange* params = plan_.find(StateKind::params, b);
  const OwnedRange& shard = plan_.range(StateKind::param_shard, b);
  const auto [lo, hi] = plan_.values_range(b);
  const OwnedRange* master = plan_.find(StateKind::master, b);
  if (params == nullptr || params->buffer != shard.buffer || (master != nullptr && !same_place(*master, shard))) return nullptr;
  if (plan_.compute_dtype != DType::f32 || params->lo > lo || params->hi < hi || owned_in_place(*params) == nullptr) return nullptr;
  return static_cast<float*>(at(*params, lo));
}

bool Executor::in_host_memory(int buffer) const {
  return buffers_[buffer] && (plan_.buffers[buffer].tier != Tier::device || device_.kind() == DeviceKind::cpu);
}

float* Executor::owned_in_place(const OwnedRange& r) const {
  if (!in_host_memory(r.buffer) || plan_.buffers[r.buffer].dtype != DType::f32) return nullptr;
  return static_cast<float*>(at(r, r.lo));
}

void Executor::start() {
  Stream& cs = compute_stream();
  for (size_t b = 0; b < buffers_.size(); ++b) {
    const auto& pb = plan_.buffers[b];
    // Swap files start as zeroed extents (fallocate).
    if (!pb.zeroed || pb.tier == Tier::nvme) continue;
    if (pb.tier == Tier::device) {
      device_.fill(cs, buffer_view(static_cast<int>(b)), 0.0f);
    } else {
      cpu::fill(buffers_[b].data(), pb.dtype, 0.0f, pb.numel);
    }
  }
  cs.synchronize();
}

void Executor::read_values(int block, float* out) {
  const OwnedRange& r = plan_.values_owned(block);
  if (plan_.buffers[r.buffer].dtype == DType::f32) {
    read_owned(r, out);
    return;
  }
  // A frozen block's narrow parameter shard, widened.
  std::vector<char> narrow(r.numel() * dtype_size(plan_.buffers[r.buffer].dtype));
  read_owned(r, narrow.data());
  cpu::cast(narrow.data(), plan_.buffers[r.buffer].dtype, out, DType::f32, r.numel());
}

void Executor::master_values(int block, std::vector<float>& out) {
  const auto& blk = plan_.blocks[block];
  const auto& m = plan_.values_owned(block);
  Stream& cs = compute_stream();
  out.resize(blk.padded);  // every element is written below
  if (m.lo == 0 && m.hi == blk.padded) {
    read_values(block, out.data());
    return;
  }
  // The communicator gathers device memory: the owned range goes there first, wherever it lives.
  std::vector<float> mine(m.numel());
  read_values(block, mine.data());
  if (gather_numel_ == 0) {
    for (size_t b = 0; b < plan_.blocks.size(); ++b) {  // what engine/plan/estimate counts for the end's gathers
      const size_t owned = plan_.values_owned(static_cast<int>(b)).numel(), padded = plan_.blocks[b].padded;
      if (owned < padded) gather_numel_ = std::max(gather_numel_, owned + padded);
    }
  }
  Buffer gather = device_.allocate(gather_numel_ * sizeof(float), MemTag::other);
  float* part = gather.as<float>();
  float* full = part + m.numel();
  device_.copy(cs, part, mine.data(), m.numel() * sizeof(float));
  step_comm(block).all_gather(cs, {part, m.numel(), DType::f32}, {full, blk.padded, DType::f32});
  device_.copy(cs, out.data(), full, blk.padded * sizeof(float));
  cs.synchronize();
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
  const size_t bounce_bytes = std::min(kTransferBounceBytes, offload::round_up_to_io(r.numel() * e));
  if (bounce.size() < bounce_bytes) bounce = offload::AlignedBuffer(bounce_bytes);
  // Pieces start on the files' I/O alignment (sub-groups do), and so does every bounce-sized part of one.
  for (const auto& piece : swaps_.pieces(r)) {
    const size_t bytes = piece.numel * e;
    for (size_t done = 0; done < bytes; done += bounce.size()) {
      const size_t n = std::min(bounce.size(), bytes - done);
      swaps_.file(r.buffer)->read(bounce.data(), offload::round_up_to_io(n), piece.file_offset + done).wait();
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
  pieces_ = exec_.swaps_.pieces(r_);
  // A range smaller than a bounce buffer takes what it needs (and a buffer kept from a larger one).
  const size_t bytes = std::min(kTransferBounceBytes, offload::round_up_to_io(r_.numel() * element_));
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
    const SwapFiles::Piece& piece = pieces_[piece_];
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
  const size_t length = offload::round_up_to_io(filled_);
  std::memset(bounce_.data() + filled_, 0, length - filled_);
  const SwapFiles::Piece& piece = pieces_[piece_];
  exec_.swaps_.file(r_.buffer)->write(bounce_.data(), length, piece.file_offset + done_ * element_ - filled_).wait();
  filled_ = 0;
}

void Executor::OwnedWriter::finish() {
  ZEROTH_CHECK(next_ == r_.hi, "OwnedWriter: {} of block {} written up to element {} of [{}, {})", state_kind_name(r_.kind),
               exec_.plan_.blocks[r_.block].name, next_, r_.lo, r_.hi);
}

}  // namespace zeroth
