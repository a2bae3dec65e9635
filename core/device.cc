// The validating front of the Device interface and the device factory.
#include "core/device.h"

#include <sys/mman.h>  // mlock, munlock

#include <cerrno>  // errno

#include <utility>  // std::exchange

#include "core/cpu/cpu_device.h"
#include "core/error.h"
#ifdef ZEROTH_WITH_CUDA
#include "core/cuda/cuda_device.h"
#endif

namespace zeroth {

TensorView TensorView::slice(size_t offset, size_t count) const {
  ZEROTH_CHECK(offset <= numel && count <= numel - offset, "slice [{}, {}) is outside a view of {} elements", offset, offset + count,
               numel);
  return {static_cast<char*>(data) + offset * dtype_size(dtype), count, dtype};
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = std::exchange(other.device_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    tag_ = other.tag_;
  }
  return *this;
}

void Buffer::reset() {
  if (device_ != nullptr) {
    device_->raw_free(data_, bytes_);
    device_->memory_.release(bytes_, tag_);
  }
  device_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

TensorView Buffer::view(DType dtype) const { return {data_, bytes_ / dtype_size(dtype), dtype}; }

Buffer Device::allocate(size_t bytes, MemTag tag) {
  memory_.charge(bytes, tag);
  void* data = nullptr;
  try {
    data = raw_allocate(bytes);
  } catch (...) {
    memory_.release(bytes, tag);
    throw;
  }
  return Buffer(this, data, bytes, tag);
}

void Device::check_stream(const Stream& stream, std::string_view op) const {
  ZEROTH_CHECK(&stream.device() == this, "{}: stream belongs to {}, not to {}", op, stream.device().name(), name());
}

void Device::fill(Stream& stream, TensorView dst, float value) {
  check_stream(stream, "fill");
  if (dst.numel == 0) return;
  do_fill(stream, dst, value);
}

void Device::copy(Stream& stream, void* dst, const void* src, size_t bytes) {
  check_stream(stream, "copy");
  if (bytes == 0) return;
  ZEROTH_CHECK(dst != nullptr && src != nullptr, "copy of {} bytes with a null pointer", bytes);
  do_copy(stream, dst, src, bytes);
}

void Device::cast(Stream& stream, TensorView dst, TensorView src) {
  check_stream(stream, "cast");
  ZEROTH_CHECK(dst.numel == src.numel, "cast: destination has {} elements, source {}", dst.numel, src.numel);
  if (dst.numel == 0) return;
  do_cast(stream, dst, src);
}

void Device::scale(Stream& stream, TensorView x, float alpha) {
  check_stream(stream, "scale");
  if (x.numel == 0) return;
  do_scale(stream, x, alpha);
}

void Device::axpy(Stream& stream, TensorView y, float alpha, TensorView x) {
  check_stream(stream, "axpy");
  ZEROTH_CHECK(y.numel == x.numel, "axpy: y has {} elements, x {}", y.numel, x.numel);
  if (y.numel == 0) return;
  do_axpy(stream, y, alpha, x);
}

void Device::sum_squares(Stream& stream, TensorView x, float* out, bool accumulate) {
  check_stream(stream, "sum_squares");
  ZEROTH_CHECK(out != nullptr, "sum_squares: null output");
  do_sum_squares(stream, x, out, accumulate);
}

void Device::flag_nonfinite(Stream& stream, TensorView x, int32_t* flag) {
  check_stream(stream, "flag_nonfinite");
  ZEROTH_CHECK(flag != nullptr, "flag_nonfinite: null flag");
  if (x.numel == 0) return;
  do_flag_nonfinite(stream, x, flag);
}

void Device::reduce(Stream& stream, TensorView out, std::span<const TensorView> inputs, ReduceKind kind, float scale) {
  check_stream(stream, "reduce");
  ZEROTH_CHECK(!inputs.empty(), "reduce needs at least one input");
  for (const auto& in : inputs) {
    ZEROTH_CHECK(in.numel == out.numel && in.dtype == inputs[0].dtype, "reduce: inputs must all be {} elements of {}; got {} of {}",
                 out.numel, dtype_name(inputs[0].dtype), in.numel, dtype_name(in.dtype));
  }
  if (out.numel == 0) return;
  do_reduce(stream, out, inputs, kind, scale);
}

std::unique_ptr<Device> make_device(std::string_view spec, const DeviceOptions& options) {
  if (spec == "cpu") return std::make_unique<CpuDevice>(options.memory_budget);
  if (spec == "cuda" || spec.starts_with("cuda:")) {
    int index = 0;
    if (spec.size() > 5) {
      const std::string digits(spec.substr(5));
      ZEROTH_CHECK(!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos,
                   "device '{}': expected cuda:N with a GPU index N", spec);
      index = std::stoi(digits);
    }
#ifdef ZEROTH_WITH_CUDA
    return std::make_unique<CudaDevice>(index, options.memory_budget);
#else
    (void)index;
    ZEROTH_THROW(InvalidArgument,
                 "device '{}': this zeroth was built without the CUDA backend; rebuild with -DZEROTH_CUDA=ON "
                 "on a machine with the CUDA toolkit, or use device 'cpu'",
                 spec);
#endif
  }
  ZEROTH_THROW(InvalidArgument, "unknown device '{}' (use cpu, cuda or cuda:N)", spec);
}

bool Device::pin_host(void* data, size_t bytes) {
  if (mlock(data, bytes) == 0) return true;
  const int err = errno;
  if (err == EPERM || err == ENOMEM || err == EAGAIN) return false;  // over RLIMIT_MEMLOCK, or not allowed
  ZEROTH_THROW(Error, "mlock({}, {}) failed: {}", data, bytes, detail::errno_text(err));
}

void Device::unpin_host(void* data, size_t bytes) { munlock(data, bytes); }

}  // namespace zeroth
