// CPU device: allocation, streams, and the kernels enqueued on them.
#include "core/cpu/cpu_device.h"

#include <sys/mman.h>

#include <cstdlib>  // std::aligned_alloc, std::free

#include "core/cpu/kernels.h"
#include "core/error.h"
#include "core/log.h"

namespace zeroth {

namespace {
constexpr size_t kPage = 4096;
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kSmallAlign = 64;
}  // namespace

HostBlockCache::~HostBlockCache() { release_all(); }

// Whole pages, not whole huge pages: a large block's full 2 MiB spans get huge pages and its tail
// small ones, so it holds at most a page it does not use (rounding to 2 MiB cost the tiny GPT 13% of
// its resident set: 40 MiB over 307 requested, and the estimate cannot see it).
size_t HostBlockCache::rounded(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t align = bytes >= kPage ? kPage : kSmallAlign;
  return (bytes + align - 1) / align * align;
}

void* HostBlockCache::map_block(size_t size) {
  if (size < kHugePage) {
    // Blocks of a page or more start on a page, as O_DIRECT transfers from them need.
    const size_t align = size >= kPage ? kPage : kSmallAlign;
    void* p = std::aligned_alloc(align, size);
    if (p == nullptr) ZEROTH_THROW(OutOfMemory, "aligned_alloc({}, {}) failed: host memory exhausted", align, size);
    return p;
  }
  constexpr unsigned kColors = 8;
  unsigned color;
  {
    std::lock_guard lock(mutex_);
    color = color_++ % kColors;
  }
  // One huge page of slack for alignment, and the color's offset; the slack stays mapped but is
  // never touched, so it costs address space only.
  const size_t length = size + kHugePage * (1 + color);
  void* raw = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    ZEROTH_THROW(OutOfMemory, "mmap({} bytes) failed: {}", length, detail::errno_text(errno));
  }
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage + color * kHugePage;
  void* block = reinterpret_cast<void*>(aligned);
  madvise(block, size, MADV_HUGEPAGE);  // advisory: a kernel without THP just ignores it
  // Touch every page now, at allocation time, instead of inside the first step that uses it.
  auto* bytes = static_cast<volatile char*>(block);
  for (size_t off = 0; off < size; off += kPage) bytes[off] = 0;
  std::lock_guard lock(mutex_);
  mappings_[block] = {raw, length};
  return block;
}

void HostBlockCache::unmap_block(void* data, size_t size) {
  if (size < kHugePage) {
    std::free(data);
    return;
  }
  Mapping m{};
  {
    std::lock_guard lock(mutex_);
    auto it = mappings_.find(data);
    if (it == mappings_.end()) {
      ZLOG_ERROR("host block cache: no mapping recorded for block {} of {} bytes; leaking it", data, size);
      return;
    }
    m = it->second;
    mappings_.erase(it);
  }
  if (munmap(m.base, m.length) != 0) {
    // Runs from destructors: report, do not throw.
    ZLOG_ERROR("munmap({}, {}) failed: {}", m.base, m.length, detail::errno_text(errno));
  }
}

void* HostBlockCache::allocate(size_t bytes) {
  const size_t size = rounded(bytes);
  {
    std::lock_guard lock(mutex_);
    if (auto it = free_blocks_.find(size); it != free_blocks_.end()) {
      void* block = it->second;
      free_blocks_.erase(it);
      cached_ -= size;
      return block;
    }
  }
  void* block = nullptr;
  try {
    block = map_block(size);
  } catch (const OutOfMemory&) {
    release_all();  // cached blocks of other sizes may be what stands in the way
    block = map_block(size);
  }
  std::lock_guard lock(mutex_);
  reserved_ += size;
  return block;
}

void HostBlockCache::free(void* data, size_t bytes) {
  if (data == nullptr) return;
  const size_t size = rounded(bytes);
  std::lock_guard lock(mutex_);
  free_blocks_.emplace(size, data);
  cached_ += size;
}

void HostBlockCache::release_all() {
  std::multimap<size_t, void*> blocks;
  {
    std::lock_guard lock(mutex_);
    blocks.swap(free_blocks_);
    reserved_ -= cached_;
    cached_ = 0;
  }
  for (auto& [size, data] : blocks) unmap_block(data, size);
}

size_t HostBlockCache::reserved_bytes() const {
  std::lock_guard lock(mutex_);
  return reserved_;
}

size_t HostBlockCache::cached_bytes() const {
  std::lock_guard lock(mutex_);
  return cached_;
}

CpuDevice::CpuDevice(size_t memory_budget) : Device("cpu", memory_budget), default_stream_(std::make_unique<CpuStream>(*this)) {}

CpuDevice::~CpuDevice() { default_stream_.reset(); }

std::unique_ptr<Stream> CpuDevice::create_stream() { return std::make_unique<CpuStream>(*this, &streams_); }
std::unique_ptr<Event> CpuDevice::create_event() { return std::make_unique<CpuEvent>(); }

void CpuDevice::synchronize() {
  default_stream_->synchronize();
  for (auto* s : streams_.snapshot()) s->synchronize();
}

void* CpuDevice::raw_allocate(size_t bytes) { return cache_.allocate(bytes); }

CpuStream& CpuDevice::cpu_stream(Stream& stream) {
  if (auto* cpu = dynamic_cast<CpuStream*>(&stream)) return *cpu;
  ZEROTH_THROW(InvalidArgument, "stream is not a CPU stream");
}

void CpuDevice::do_fill(Stream& stream, TensorView dst, float value) {
  cpu_stream(stream).enqueue([=] { cpu::fill(dst.data, dst.dtype, value, dst.numel); });
}

void CpuDevice::do_copy(Stream& stream, void* dst, const void* src, size_t bytes) {
  cpu_stream(stream).enqueue([=] { cpu::copy(dst, src, bytes); });
}

void CpuDevice::do_cast(Stream& stream, TensorView dst, TensorView src) {
  cpu_stream(stream).enqueue([=] { cpu::cast(src.data, src.dtype, dst.data, dst.dtype, dst.numel); });
}

void CpuDevice::do_scale(Stream& stream, TensorView x, float alpha) {
  cpu_stream(stream).enqueue([=] { cpu::scale(x.data, x.dtype, alpha, x.numel); });
}

void CpuDevice::do_axpy(Stream& stream, TensorView y, float alpha, TensorView x) {
  cpu_stream(stream).enqueue([=] { cpu::axpy(y.data, y.dtype, alpha, x.data, x.dtype, y.numel); });
}

void CpuDevice::do_sum_squares(Stream& stream, TensorView x, float* out, bool accumulate) {
  cpu_stream(stream).enqueue([=] {
    const auto sum = static_cast<float>(cpu::sum_squares(x.data, x.dtype, x.numel));
    *out = accumulate ? *out + sum : sum;
  });
}

void CpuDevice::do_flag_nonfinite(Stream& stream, TensorView x, int32_t* flag) {
  cpu_stream(stream).enqueue([=] {
    if (cpu::has_nonfinite(x.data, x.dtype, x.numel)) *flag = 1;
  });
}

}  // namespace zeroth

namespace zeroth {

void CpuDevice::do_reduce(Stream& stream, TensorView out, std::span<const TensorView> inputs, ReduceKind kind, float scale) {
  std::vector<const void*> pointers;
  pointers.reserve(inputs.size());
  for (const auto& in : inputs) pointers.push_back(in.data);
  cpu_stream(stream).enqueue([=, pointers = std::move(pointers), in_type = inputs[0].dtype] {
    cpu::reduce(pointers.data(), static_cast<int>(pointers.size()), in_type, out.data, out.dtype, kind, scale, out.numel);
  });
}

}  // namespace zeroth
