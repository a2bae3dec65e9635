// CUDA device, streams and events.
#include "core/cuda/cuda_device.h"

#include <cstdint>  // UINT64_MAX
#include <vector>   // std::vector
#include <utility>  // std::exchange

#include "core/cuda/cuda_check.h"
#include "core/error.h"
#include "core/cuda/cuda_info.h"
#include "core/cuda/cuda_kernels.h"
#include "core/log.h"

namespace zeroth {

CudaDeviceGuard::CudaDeviceGuard(int index) {
  CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) CUDA_CHECK(cudaSetDevice(index));
}

CudaDeviceGuard::~CudaDeviceGuard() {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
}

// ---- streams --------------------------------------------------------------------------------

struct CudaStream::HostCall {
  CudaStream* stream;
  std::function<void()> fn;
};

CudaStream::CudaStream(Device& device, int index) : device_(device), index_(index) {
  CudaDeviceGuard guard(index_);
  // Blocking streams (not cudaStreamNonBlocking): frees on the legacy stream order after them.
  CUDA_CHECK(cudaStreamCreate(&stream_));
}

CudaStream::~CudaStream() {
  if (stream_ == nullptr) return;
  CudaDeviceGuard guard(index_);
  if (cudaStreamSynchronize(stream_) != cudaSuccess) {
    ZLOG_ERROR("cuda:{} stream destroyed with a failed operation: {}", index_, cudaGetErrorString(cudaGetLastError()));
  }
  cudaStreamDestroy(stream_);
  if (host_error_) ZLOG_ERROR("cuda:{} stream destroyed with a host-callback error nobody synchronized on", index_);
}

void CudaStream::wait(const Event& event) {
  const auto* cuda_event = dynamic_cast<const CudaEvent*>(&event);
  ZEROTH_CHECK(cuda_event != nullptr, "a CUDA stream can only wait on CUDA events");
  CUDA_CHECK(cudaStreamWaitEvent(stream_, cuda_event->handle(), 0));
}

void CudaStream::synchronize() {
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::exception_ptr error;
  {
    std::lock_guard lock(error_mutex_);
    error = std::exchange(host_error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void CUDART_CB CudaStream::run_host_call(void* data) {
  std::unique_ptr<HostCall> call(static_cast<HostCall*>(data));
  try {
    call->fn();
  } catch (...) {
    std::lock_guard lock(call->stream->error_mutex_);
    if (!call->stream->host_error_) call->stream->host_error_ = std::current_exception();
  }
}

void CudaStream::enqueue_host(std::function<void()> fn) {
  auto call = std::make_unique<HostCall>(HostCall{this, std::move(fn)});
  CUDA_CHECK(cudaLaunchHostFunc(stream_, &CudaStream::run_host_call, call.get()));
  call.release();  // owned by the callback from here on
}

// ---- events ---------------------------------------------------------------------------------

CudaEvent::CudaEvent(int index) : index_(index) {
  CudaDeviceGuard guard(index_);
  CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

void CudaEvent::record(Stream& stream) {
  auto* cuda_stream = dynamic_cast<CudaStream*>(&stream);
  ZEROTH_CHECK(cuda_stream != nullptr, "a CUDA event can only be recorded on a CUDA stream");
  CUDA_CHECK(cudaEventRecord(event_, cuda_stream->handle()));
}

void CudaEvent::synchronize() { CUDA_CHECK(cudaEventSynchronize(event_)); }

bool CudaEvent::query() {
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  CUDA_CHECK(err);
  return true;
}

// ---- device ---------------------------------------------------------------------------------

namespace {
size_t resolve_budget(int index, size_t requested) {
  const int count = cuda_device_count();
  if (index < 0 || index >= count) {
    ZEROTH_THROW(CudaError, "cuda:{} requested but {} usable GPU(s) found ({})", index, count,
                 count == 0 ? cuda_info().problem : std::string("index out of range"));
  }
  if (requested != 0) return requested;
  CudaDeviceGuard guard(index);
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}
}  // namespace

CudaDevice::CudaDevice(int index, size_t memory_budget)
    : Device("cuda:" + std::to_string(index), resolve_budget(index, memory_budget)), index_(index) {
  CudaDeviceGuard guard(index_);
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, index_));
  // Keep freed memory in the pool: steps reuse it instead of returning it to the driver.
  uint64_t threshold = UINT64_MAX;
  CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
  default_stream_ = std::make_unique<CudaStream>(*this, index_);
}

CudaDevice::~CudaDevice() {
  default_stream_.reset();
  CudaDeviceGuard guard(index_);
  cudaDeviceSynchronize();
}

std::string CudaDevice::name() const { return "cuda:" + std::to_string(index_); }

std::unique_ptr<Stream> CudaDevice::create_stream() { return std::make_unique<CudaStream>(*this, index_); }
std::unique_ptr<Event> CudaDevice::create_event() { return std::make_unique<CudaEvent>(index_); }

void CudaDevice::synchronize() {
  CudaDeviceGuard guard(index_);
  CUDA_CHECK(cudaDeviceSynchronize());
  default_stream_->synchronize();
}

void CudaDevice::release_cached_memory() {
  CudaDeviceGuard guard(index_);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
}

bool CudaDevice::pin_host(void* data, size_t bytes) {
  CudaDeviceGuard guard(index_);
  CUDA_CHECK(cudaHostRegister(data, bytes, cudaHostRegisterDefault));
  return true;
}

void CudaDevice::unpin_host(void* data, size_t bytes) {
  // Called while buffers are torn down: a failure is reported, not thrown.
  CudaDeviceGuard guard(index_);
  if (const cudaError_t err = cudaHostUnregister(data); err != cudaSuccess)
    ZLOG_WARN("cudaHostUnregister({}) of {} bytes failed: {}", data, bytes, cudaGetErrorString(err));
}

// Allocation and free go through the legacy default stream, which orders after all work on the
// device's (blocking) streams: a block is reused only after the work that used it.
void* CudaDevice::raw_allocate(size_t bytes) {
  CudaDeviceGuard guard(index_);
  void* data = nullptr;
  const cudaError_t err = cudaMallocAsync(&data, bytes == 0 ? 1 : bytes, cudaStreamLegacy);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    ZEROTH_THROW(OutOfMemory, "cudaMallocAsync({} bytes) on {} failed: the GPU is out of memory ({})", bytes, name(),
                 memory().summary());
  }
  CUDA_CHECK(err);
  CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  return data;
}

void CudaDevice::raw_free(void* data, size_t) {
  CudaDeviceGuard guard(index_);
  const cudaError_t err = cudaFreeAsync(data, cudaStreamLegacy);
  if (err != cudaSuccess) {
    cudaGetLastError();
    ZLOG_ERROR("cudaFreeAsync({}) on {} failed: {}", data, name(), cudaGetErrorString(err));
  }
}

cudaStream_t CudaDevice::handle(Stream& stream) const {
  auto* cuda_stream = dynamic_cast<CudaStream*>(&stream);
  ZEROTH_CHECK(cuda_stream != nullptr, "stream is not a CUDA stream");
  return cuda_stream->handle();
}

void CudaDevice::do_fill(Stream& stream, TensorView dst, float value) {
  CudaDeviceGuard guard(index_);
  cuda::launch_fill(dst.data, dst.dtype, value, dst.numel, handle(stream));
}

void CudaDevice::do_copy(Stream& stream, void* dst, const void* src, size_t bytes) {
  CudaDeviceGuard guard(index_);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, handle(stream)));
}

void CudaDevice::do_cast(Stream& stream, TensorView dst, TensorView src) {
  CudaDeviceGuard guard(index_);
  if (dst.dtype == src.dtype) {
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, handle(stream)));
    return;
  }
  cuda::launch_cast(src.data, src.dtype, dst.data, dst.dtype, dst.numel, handle(stream));
}

void CudaDevice::do_scale(Stream& stream, TensorView x, float alpha) {
  CudaDeviceGuard guard(index_);
  cuda::launch_scale(x.data, x.dtype, alpha, x.numel, handle(stream));
}

void CudaDevice::do_axpy(Stream& stream, TensorView y, float alpha, TensorView x) {
  CudaDeviceGuard guard(index_);
  cuda::launch_axpy(y.data, y.dtype, alpha, x.data, x.dtype, y.numel, handle(stream));
}

void CudaDevice::do_sum_squares(Stream& stream, TensorView x, float* out, bool accumulate) {
  CudaDeviceGuard guard(index_);
  cuda::launch_sum_squares(x.data, x.dtype, x.numel, out, accumulate, handle(stream));
}

void CudaDevice::do_flag_nonfinite(Stream& stream, TensorView x, int32_t* flag) {
  CudaDeviceGuard guard(index_);
  cuda::launch_flag_nonfinite(x.data, x.dtype, x.numel, flag, handle(stream));
}

void CudaDevice::do_reduce(Stream& stream, TensorView out, std::span<const TensorView> inputs, ReduceKind kind, float scale) {
  CudaDeviceGuard guard(index_);
  std::vector<const void*> pointers;
  for (const auto& in : inputs) pointers.push_back(in.data);
  cuda::launch_reduce(pointers.data(), static_cast<int>(pointers.size()), inputs[0].dtype, out.data, out.dtype,
                      kind == ReduceKind::max, scale, out.numel, handle(stream));
}

}  // namespace zeroth
