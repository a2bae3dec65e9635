// Parallel entry points of the CPU kernels: split the work into fixed chunks over oneTBB and call
// the dispatched serial kernel on each.
#include "core/cpu/kernels.h"

#include <tbb/global_control.h>
#include <tbb/info.h>

#include <algorithm>  // std::min, std::fill
#include <array>      // std::array
#include <atomic>     // std::atomic
#include <cstring>    // memcpy
#include <memory>     // std::unique_ptr
#include <mutex>      // std::mutex
#include <utility>    // std::exchange

#include "core/cpu/parallel.h"
#include "core/env.h"
#include "core/error.h"

namespace zeroth::cpu {

const KernelTable& kernel_table_scalar();
const KernelTable& kernel_table_avx2();
const KernelTable& kernel_table_avx512();

const KernelTable& kernel_table(SimdLevel level) {
  ZEROTH_CHECK(level <= best_simd_level(), "SIMD level {} is not supported by this CPU (best: {})", simd_level_name(level),
               simd_level_name(best_simd_level()));
  switch (level) {
    case SimdLevel::avx512: return kernel_table_avx512();
    case SimdLevel::avx2: return kernel_table_avx2();
    case SimdLevel::scalar: break;
  }
  return kernel_table_scalar();
}

namespace {

// Outputs larger than this bypass the cache: they would only evict the inputs.
constexpr size_t kStreamingStoreBytes = size_t{8} << 20;

std::mutex thread_mutex;
std::unique_ptr<tbb::global_control> thread_limit;
int thread_count = 0;

size_t chunk_count(size_t n, size_t chunk = kChunkElements) { return (n + chunk - 1) / chunk; }

template <class T>
T* at(void* p, size_t byte_offset) {
  return reinterpret_cast<T*>(static_cast<char*>(p) + byte_offset);
}
template <class T>
const T* at(const void* p, size_t byte_offset) {
  return reinterpret_cast<const T*>(static_cast<const char*>(p) + byte_offset);
}

}  // namespace

int num_threads() {
  std::lock_guard lock(thread_mutex);
  if (thread_count == 0) {
    thread_count = tbb::info::default_concurrency();
    if (auto requested = env::get_int(env::kNumThreads)) {
      ZEROTH_CHECK(*requested >= 1, "{} must be at least 1, got {}", env::kNumThreads, *requested);
      thread_count = static_cast<int>(std::min<int64_t>(*requested, 4096));
      thread_limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, thread_count);
    }
  }
  return thread_count;
}

void set_num_threads(int threads) {
  ZEROTH_CHECK(threads >= 1, "thread count must be at least 1, got {}", threads);
  std::lock_guard lock(thread_mutex);
  thread_limit.reset();
  thread_limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, threads);
  thread_count = threads;
}

void cast(const void* src, DType src_type, void* dst, DType dst_type, size_t n, SimdLevel level) {
  if (src_type == dst_type) return copy(dst, src, n * dtype_size(src_type));
  const auto& table = kernel_table(level);
  const bool nt = n * dtype_size(dst_type) >= kStreamingStoreBytes;
  const size_t ss = dtype_size(src_type), ds = dtype_size(dst_type);
  for_chunks(n, kChunkElements,
             [&](size_t b, size_t e) { table.cast(at<char>(src, b * ss), src_type, at<char>(dst, b * ds), dst_type, e - b, nt); });
}

void copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  const auto& table = kernel_table(active_simd_level());
  const bool nt = bytes >= kStreamingStoreBytes;
  for_chunks(bytes, size_t{1} << 20, [&](size_t b, size_t e) { table.copy(at<char>(dst, b), at<char>(src, b), e - b, nt); });
}

void fill(void* dst, DType type, float value, size_t n) {
  if (type == DType::f32) {
    for_chunks(n, kChunkElements, [&](size_t b, size_t e) { std::fill(at<float>(dst, b * 4), at<float>(dst, e * 4), value); });
    return;
  }
  uint16_t bits = type == DType::bf16 ? f32_to_bf16_bits(value) : f32_to_f16_bits(value);
  for_chunks(n, kChunkElements, [&](size_t b, size_t e) { std::fill(at<uint16_t>(dst, b * 2), at<uint16_t>(dst, e * 2), bits); });
}

void axpy(void* y, DType y_type, float alpha, const void* x, DType x_type, size_t n, SimdLevel level) {
  const auto& table = kernel_table(level);
  const size_t ys = dtype_size(y_type), xs = dtype_size(x_type);
  for_chunks(n, kChunkElements,
             [&](size_t b, size_t e) { table.axpy(at<char>(y, b * ys), y_type, alpha, at<char>(x, b * xs), x_type, e - b); });
}

void scale(void* x, DType type, float alpha, size_t n, SimdLevel level) {
  const auto& table = kernel_table(level);
  const size_t s = dtype_size(type);
  for_chunks(n, kChunkElements, [&](size_t b, size_t e) { table.scale(at<char>(x, b * s), type, alpha, e - b); });
}

double sum_squares(const void* x, DType type, size_t n, SimdLevel level) {
  const auto& table = kernel_table(level);
  const size_t s = dtype_size(type);
  const size_t chunks = chunk_count(n);
  std::vector<double> partial(chunks, 0.0);
  for_chunks(n, kChunkElements, [&](size_t b, size_t e) {
    float lanes[16] = {};
    table.sumsq(at<char>(x, b * s), type, e - b, lanes);
    // Fixed pairwise tree over the 16 lanes, in f32 like the lanes themselves.
    for (int width = 8; width >= 1; width /= 2) {
      for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
    }
    partial[b / kChunkElements] = lanes[0];
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void SegmentedSumSquares::add(const float* x, size_t n) {
  while (n > 0) {
    if (carry_.empty() && n >= kChunkElements) {
      total_ += sum_squares(x, DType::f32, kChunkElements);
      x += kChunkElements;
      n -= kChunkElements;
      continue;
    }
    const size_t take = std::min(n, kChunkElements - carry_.size());
    carry_.insert(carry_.end(), x, x + take);
    x += take;
    n -= take;
    if (carry_.size() == kChunkElements) {
      total_ += sum_squares(carry_.data(), DType::f32, kChunkElements);
      carry_.clear();
    }
  }
}

double SegmentedSumSquares::finish() {
  if (!carry_.empty()) total_ += sum_squares(carry_.data(), DType::f32, carry_.size());
  carry_.clear();
  return std::exchange(total_, 0.0);
}

void reduce(const void* const* inputs, int k, DType in_type, void* out, DType out_type, ReduceKind kind, float scale, size_t n,
            SimdLevel level) {
  ZEROTH_CHECK(k >= 1, "reduce needs at least one input, got {}", k);
  const auto& table = kernel_table(level);
  const size_t is = dtype_size(in_type), os = dtype_size(out_type);
  const bool nt = n * os >= kStreamingStoreBytes;
  for_chunks(n, kChunkElements, [&](size_t b, size_t e) {
    constexpr int kInline = 64;
    std::array<const void*, kInline> inline_ptrs;
    std::vector<const void*> heap_ptrs;
    const void** ptrs = inline_ptrs.data();
    if (k > kInline) {
      heap_ptrs.resize(k);
      ptrs = heap_ptrs.data();
    }
    for (int p = 0; p < k; ++p) ptrs[p] = at<char>(inputs[p], b * is);
    table.reduce(ptrs, k, in_type, at<char>(out, b * os), out_type, kind, scale, e - b, nt);
  });
}

bool has_nonfinite(const void* x, DType type, size_t n, SimdLevel level) {
  const auto& table = kernel_table(level);
  const size_t s = dtype_size(type);
  std::atomic<bool> found{false};
  for_chunks(n, kChunkElements, [&](size_t b, size_t e) {
    if (!found.load(std::memory_order_relaxed) && table.has_nonfinite(at<char>(x, b * s), type, e - b)) {
      found.store(true, std::memory_order_relaxed);
    }
  });
  return found.load();
}

}  // namespace zeroth::cpu
