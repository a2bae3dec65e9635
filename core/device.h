// The Device interface: memory (tagged, budgeted), streams and events, and the element-wise
// kernels the engine runs, all enqueued on a stream and completed in stream order.
#pragma once

#include <cstddef>      // size_t
#include <cstdint>      // int32_t
#include <functional>   // std::function
#include <memory>       // std::unique_ptr
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "core/dtype.h"   // DType
#include "core/memory.h"  // MemTag, MemoryAccounting

namespace zeroth {

class Device;
class Event;

enum class DeviceKind : uint8_t { cpu, cuda };

// A typed, non-owning view of `numel` contiguous elements.
struct TensorView {
  void* data = nullptr;
  size_t numel = 0;
  DType dtype = DType::f32;

  size_t bytes() const { return numel * dtype_size(dtype); }
  TensorView slice(size_t offset, size_t count) const;
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// Owns one allocation on a device; returns it (and its accounting) when destroyed. Free a buffer
// only when no stream still uses it, as with cudaFree.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device* device, void* data, size_t bytes, MemTag tag) : device_(device), data_(data), bytes_(bytes), tag_(tag) {}
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset();
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemTag tag() const { return tag_; }
  Device* device() const { return device_; }
  explicit operator bool() const { return data_ != nullptr; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  // The whole buffer as `numel = bytes / dtype_size` elements.
  TensorView view(DType dtype) const;

 private:
  Device* device_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemTag tag_ = MemTag::other;
};

// Work enqueued on a stream runs in order, concurrently with other streams. An error raised by
// the work is kept and rethrown by the next synchronize() (of the stream, or of an event recorded
// after it); work after a failure is skipped until then, and the error travels to streams that
// wait on such an event.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device& device() const = 0;
  // Later work on this stream waits until `event`'s most recent record has completed.
  virtual void wait(const Event& event) = 0;
  // Blocks until all enqueued work completed; rethrows the first error it raised.
  virtual void synchronize() = 0;
  // Runs `fn` on the host in stream order (it must not enqueue device work itself on CUDA).
  virtual void enqueue_host(std::function<void()> fn) = 0;
};

class Event {
 public:
  virtual ~Event() = default;
  // Marks the current end of `stream`'s work.
  virtual void record(Stream& stream) = 0;
  // Blocks until the recorded work completed; rethrows an error raised before the record.
  // An event never recorded is complete.
  virtual void synchronize() = 0;
  virtual bool query() = 0;
};

class Device {
 public:
  Device(std::string name, size_t budget) : memory_(std::move(name), budget) {}
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;
  MemoryAccounting& memory() { return memory_; }

  // Throws OutOfMemory past the budget. Memory is not initialized.
  Buffer allocate(size_t bytes, MemTag tag);
  virtual std::unique_ptr<Stream> create_stream() = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  virtual Stream& default_stream() = 0;
  // Waits for every stream of this device created through it and the default stream.
  virtual void synchronize() = 0;
  // Returns cached, unused blocks to the system.
  virtual void release_cached_memory() = 0;
  // Page-locks host memory for transfers with this device (CUDA: cudaHostRegister; the CPU device:
  // mlock). Returns false when the system refuses (RLIMIT_MEMLOCK, for mlock): the memory stays
  // usable, pageable. unpin_host undoes a successful pin_host.
  virtual bool pin_host(void* data, size_t bytes);
  virtual void unpin_host(void* data, size_t bytes);

  // Element-wise kernels, validated here and enqueued on `stream`. Pointers are device memory.
  void fill(Stream& stream, TensorView dst, float value);
  void copy(Stream& stream, void* dst, const void* src, size_t bytes);  // host<->device too on CUDA
  void cast(Stream& stream, TensorView dst, TensorView src);            // numel must match
  void scale(Stream& stream, TensorView x, float alpha);
  void axpy(Stream& stream, TensorView y, float alpha, TensorView x);  // y += alpha * x, in f32
  // *out = sum(x^2) (or += with accumulate), f32 accumulation; out is one f32 in device memory.
  void sum_squares(Stream& stream, TensorView x, float* out, bool accumulate);
  // Sets *flag = 1 when x holds an Inf or NaN; leaves it alone otherwise (so flags accumulate).
  void flag_nonfinite(Stream& stream, TensorView x, int32_t* flag);
  // out = scale * (inputs[0] + inputs[1] + ...) or the element-wise max (NaN propagates), in f32
  // and in input order. Inputs share one dtype and size; out may alias one of them.
  void reduce(Stream& stream, TensorView out, std::span<const TensorView> inputs, ReduceKind kind, float scale = 1.0f);

 protected:
  friend class Buffer;
  virtual void* raw_allocate(size_t bytes) = 0;
  virtual void raw_free(void* data, size_t bytes) = 0;

  virtual void do_fill(Stream& stream, TensorView dst, float value) = 0;
  virtual void do_copy(Stream& stream, void* dst, const void* src, size_t bytes) = 0;
  virtual void do_cast(Stream& stream, TensorView dst, TensorView src) = 0;
  virtual void do_scale(Stream& stream, TensorView x, float alpha) = 0;
  virtual void do_axpy(Stream& stream, TensorView y, float alpha, TensorView x) = 0;
  virtual void do_sum_squares(Stream& stream, TensorView x, float* out, bool accumulate) = 0;
  virtual void do_flag_nonfinite(Stream& stream, TensorView x, int32_t* flag) = 0;
  virtual void do_reduce(Stream& stream, TensorView out, std::span<const TensorView> inputs, ReduceKind kind, float scale) = 0;

 private:
  void check_stream(const Stream& stream, std::string_view op) const;
  MemoryAccounting memory_;
};

struct DeviceOptions {
  size_t memory_budget = 0;  // bytes; 0: the CPU is unlimited, a GPU gets its free memory
};

// "cpu", "cuda" or "cuda:N". A CUDA spec on a build or machine without CUDA raises an error
// that says which.
std::unique_ptr<Device> make_device(std::string_view spec, const DeviceOptions& options = {});

}  // namespace zeroth
