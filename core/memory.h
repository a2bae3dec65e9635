// Tagged memory accounting with a budget, and byte-size formatting/parsing.
#pragma once

#include <array>        // std::array
#include <cstddef>      // size_t
#include <cstdint>      // uint8_t
#include <mutex>        // std::mutex
#include <string>       // std::string
#include <string_view>  // std::string_view

namespace zeroth {

// n rounded up to a multiple of `multiple` (> 0).
constexpr size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

enum class MemTag : uint8_t { params = 0, grads, optimizer, buffers, activations, other };
inline constexpr size_t kMemTagCount = 6;
std::string_view mem_tag_name(MemTag tag);

// The process's peak resident set size in bytes (VmHWM of /proc/self/status); 0 where the kernel
// does not report it.
size_t process_peak_rss();
// Its resident set size now (VmRSS).
size_t process_rss();
// What the kernel estimates can be allocated without swapping (MemAvailable of /proc/meminfo);
// 0 where it does not say.
size_t available_memory();

// Tokens per chunk of a loss computed by chunks over `vocab_slice` logits a token (one rank's
// slice of the vocabulary): a chunk's f32 logits near 64 MiB, a multiple of 64 tokens, at least 64.
// The model (GptConfig::auto_loss_chunk_rows) and the planner's memory model share it.
inline size_t logits_chunk_rows(size_t vocab_slice) {
  constexpr size_t kChunkFloats = size_t{16} << 20;
  const size_t rows = kChunkFloats / (vocab_slice > 0 ? vocab_slice : 1) / 64 * 64;
  return rows < 64 ? 64 : rows > (size_t{1} << 20) ? size_t{1} << 20 : rows;
}

// "1.50 GiB", "512 B"
std::string format_bytes(size_t bytes);
// "2GiB", "512 MiB", "1.5GB", "4096"; InvalidArgument on anything else.
size_t parse_bytes(std::string_view text);

struct MemoryStats {
  std::array<size_t, kMemTagCount> in_use{};
  std::array<size_t, kMemTagCount> peak{};  // per tag, since the last reset
  size_t total_in_use = 0;
  size_t total_peak = 0;  // of the sum, not the sum of the per-tag peaks
  size_t budget = 0;      // 0: unlimited
};

// Exact accounting of requested bytes. Thread-safe; allocations are not on a hot path.
class MemoryAccounting {
 public:
  MemoryAccounting(std::string device_name, size_t budget);

  // Records an allocation, or throws OutOfMemory (naming tag, request, use, budget and peak)
  // when it would exceed the budget; nothing is recorded then.
  void charge(size_t bytes, MemTag tag);
  void release(size_t bytes, MemTag tag);
  // Whether `bytes` more would fit in the budget now.
  bool fits(size_t bytes) const;
  MemoryStats stats() const;
  void reset_peak();
  size_t budget() const { return budget_; }
  std::string summary() const;  // one line: in use / peak per tag

 private:
  std::string describe_locked() const;

  std::string device_name_;
  size_t budget_;
  mutable std::mutex mutex_;
  MemoryStats stats_;
};

}  // namespace zeroth
