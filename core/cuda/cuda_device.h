// The CUDA device: a stream-ordered caching pool (cudaMallocAsync), CUDA streams and events,
// and the element-wise kernels of cuda_kernels.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <exception>  // std::exception_ptr
#include <memory>     // std::unique_ptr
#include <mutex>      // std::mutex

#include "core/device.h"

namespace zeroth {

class CudaStream final : public Stream {
 public:
  explicit CudaStream(Device& device, int index);
  ~CudaStream() override;

  Device& device() const override { return device_; }
  void wait(const Event& event) override;
  void synchronize() override;
  void enqueue_host(std::function<void()> fn) override;
  cudaStream_t handle() const { return stream_; }

 private:
  struct HostCall;
  static void CUDART_CB run_host_call(void* data);

  Device& device_;
  int index_;
  cudaStream_t stream_ = nullptr;
  std::mutex error_mutex_;
  std::exception_ptr host_error_;  // first exception thrown by a host callback
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int index);
  ~CudaEvent() override;
  void record(Stream& stream) override;
  void synchronize() override;
  bool query() override;
  cudaEvent_t handle() const { return event_; }

 private:
  int index_;
  cudaEvent_t event_ = nullptr;
};

class CudaDevice final : public Device {
 public:
  // budget 0: the free memory of the GPU when the device is created.
  CudaDevice(int index, size_t memory_budget);
  ~CudaDevice() override;

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string name() const override;
  int index() const { return index_; }
  std::unique_ptr<Stream> create_stream() override;
  std::unique_ptr<Event> create_event() override;
  Stream& default_stream() override { return *default_stream_; }
  void synchronize() override;
  void release_cached_memory() override;
  bool pin_host(void* data, size_t bytes) override;
  void unpin_host(void* data, size_t bytes) override;

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_free(void* data, size_t bytes) override;

  void do_fill(Stream& stream, TensorView dst, float value) override;
  void do_copy(Stream& stream, void* dst, const void* src, size_t bytes) override;
  void do_cast(Stream& stream, TensorView dst, TensorView src) override;
  void do_scale(Stream& stream, TensorView x, float alpha) override;
  void do_axpy(Stream& stream, TensorView y, float alpha, TensorView x) override;
  void do_sum_squares(Stream& stream, TensorView x, float* out, bool accumulate) override;
  void do_flag_nonfinite(Stream& stream, TensorView x, int32_t* flag) override;
  void do_reduce(Stream& stream, TensorView out, std::span<const TensorView> inputs, ReduceKind kind, float scale) override;

 private:
  cudaStream_t handle(Stream& stream) const;

  int index_;
  cudaMemPool_t pool_ = nullptr;
  std::unique_ptr<CudaStream> default_stream_;
};

// Makes `index` the current CUDA device for the scope.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int index);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace zeroth
