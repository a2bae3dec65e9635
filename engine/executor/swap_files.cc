#include "engine/executor/swap_files.h"

#include <unistd.h>  // getpid

#include <algorithm>  // std::max, std::min
#include <chrono>     // std::chrono::steady_clock

#include <fmt/format.h>  // fmt::format

#include "core/error.h"  // ZEROTH_CHECK
#include "core/log.h"    // ZLOG_WARN

namespace zeroth {

std::string swap_folder(const ZeroConfig& zero, const PlannedBuffer& buffer) {
  return buffer.tag == MemTag::params ? zero.offload_param.nvme_path : zero.offload_optimizer.nvme_path;
}

SwapFiles::SwapFiles(const Plan& plan, const EngineConfig& config, const std::string& file_tag)
    : plan_(plan), copy_(plan.sub_groups.size(), 0) {
  const offload::IoOptions io{.block_size = config.aio.block_size,
                              .queue_depth = static_cast<unsigned>(config.aio.queue_depth),
                              .threads = static_cast<unsigned>(config.aio.threads)};
  for (const auto& b : plan_.buffers) {
    if (b.tier != Tier::nvme) {
      files_.emplace_back();
      continue;
    }
    // The pid keeps ranks of concurrent runs that share a folder apart, the tag a pipeline's stages
    // and a slice's ranks in one process (each has its own data-parallel rank numbering); the file
    // is unlinked at once.
    files_.push_back(
        std::make_unique<offload::SwapFile>(swap_folder(config.zero, b),
                                            fmt::format("zeroth-{}-{}rank{}-{}.swap", ::getpid(), file_tag, plan_.rank, b.name),
                                            b.bytes(), io));
  }
}

bool SwapFiles::register_buffer(void* data, size_t bytes, const std::string& name) {
  for (const auto& file : files_) {
    if (!file) continue;
    try {
      file->file().register_buffer(data, bytes);
    } catch (const std::exception& e) {
      ZLOG_WARN("swap files: {} runs without registered buffers: {}", name, e.what());
      return false;
    }
  }
  return true;
}

uint64_t SwapFiles::offset(int buffer, int sub_group, size_t lo, bool other_copy) const {
  const auto& pb = plan_.buffers[buffer];
  const size_t copy = pb.two_copies ? static_cast<size_t>(copy_[sub_group] ^ (other_copy ? 1 : 0)) : 0;
  return (lo + copy * (pb.numel / 2)) * dtype_size(pb.dtype);
}

std::vector<SwapFiles::Piece> SwapFiles::pieces(const OwnedRange& r) const {
  const auto& pb = plan_.buffers[r.buffer];
  if (!pb.two_copies) return {{r.offset, r.numel(), r.offset * dtype_size(pb.dtype)}};
  // Sub-groups tile the offloaded space in order; a range may cross several.
  std::vector<Piece> pieces;
  const size_t end = r.offset + r.numel();
  for (size_t g = 0; g < plan_.sub_groups.size(); ++g) {
    if (!plan_.sub_group_offloaded(static_cast<int>(g))) continue;
    const auto [lo, hi] = plan_.sub_group_extent[g];
    const size_t a = std::max(lo, r.offset), e = std::min(hi, end);
    if (a < e) pieces.push_back({a, e - a, offset(r.buffer, static_cast<int>(g), a)});
  }
  size_t covered = 0;
  for (const auto& piece : pieces) covered += piece.numel;
  ZEROTH_CHECK(covered == r.numel(), "the sub-groups cover {} of the {} elements of {} of block {}", covered, r.numel(),
               state_kind_name(r.kind), plan_.blocks[r.block].name);
  return pieces;
}

void SwapFiles::timed(uint64_t read_bytes, uint64_t write_bytes, const std::function<void()>& transfers, bool optimizer) {
  // A slot whose read failed holds garbage. The error is raised again on this stream, and by
  // check() at the step (CUDA streams keep host errors to themselves).
  if (write_bytes > 0 && failed_) {
    std::lock_guard lock(error_mutex_);
    std::rethrow_exception(error_);
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    transfers();
  } catch (...) {
    std::lock_guard lock(error_mutex_);
    if (!failed_) error_ = std::current_exception();
    failed_ = true;
    throw;
  }
  busy_ns_ += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  read_ += read_bytes;
  written_ += write_bytes;
  if (optimizer) {
    optimizer_read_ += read_bytes;
    optimizer_written_ += write_bytes;
  }
}

void SwapFiles::check() const {
  if (!failed_) return;
  std::lock_guard lock(error_mutex_);
  std::rethrow_exception(error_);
}

SwapIo SwapFiles::io() const {
  return {read_.load(), written_.load(), static_cast<double>(busy_ns_.load()) * 1e-9, optimizer_read_.load(),
          optimizer_written_.load()};
}

uint64_t SwapFiles::disk_bytes() const {
  uint64_t disk = 0;
  for (const auto& f : files_)
    if (f) disk += f->file().allocated_bytes();
  return disk;
}

}  // namespace zeroth
