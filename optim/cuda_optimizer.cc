// The CUDA optimizer step: constants on the host, one fused launch per batch of shards.
#include "core/error.h"
#include "optim/optimizer.h"
#include "optim/step_setup.h"

#ifdef ZEROTH_WITH_CUDA
#include "core/cuda/cuda_device.h"
#include "optim/cuda/optim_cuda.h"
#endif

namespace zeroth {

#ifdef ZEROTH_WITH_CUDA

namespace {

// The checks every fused launch makes; the stream's CUDA handle.
cudaStream_t checked_stream(const OptimizerParams& params, std::span<const OptimizerStep> shards, Stream& stream, const char* what) {
  auto* cuda_stream = dynamic_cast<CudaStream*>(&stream);
  ZEROTH_CHECK(cuda_stream != nullptr, "{} needs a CUDA stream, got one of {}", what, stream.device().name());
  for (const auto& s : shards) {
    const auto& first = shards.front();
    optim::check_step(params, s);
    ZEROTH_CHECK(s.step == first.step && s.lr == first.lr && s.grad_type == first.grad_type &&
                     s.copy_out_type == first.copy_out_type && s.grad_scale == first.grad_scale,
                 "shards of one fused step must share step number, lr, grad scale and dtypes");
  }
  return cuda_stream->handle();
}

std::vector<optim_cuda::Shard> shard_table(std::span<const OptimizerStep> shards) {
  std::vector<optim_cuda::Shard> table;
  for (const auto& s : shards) table.push_back({s.params, s.grads, s.state[0], s.state[1], s.copy_out, s.count});
  return table;
}

}  // namespace

void cuda_lamb_norms(const OptimizerParams& params, std::span<const OptimizerStep> shards, std::span<float* const> norms,
                     Stream& stream) {
  ZEROTH_CHECK(params.kind == OptimizerKind::lamb && norms.size() == shards.size(),
               "cuda_lamb_norms: {} with {} shards and {} norm pairs", optimizer_name(params.kind), shards.size(), norms.size());
  const cudaStream_t handle = checked_stream(params, shards, stream, "cuda_lamb_norms");
  if (shards.empty()) return;
  const auto table = shard_table(shards);
  CudaDeviceGuard guard(static_cast<CudaDevice&>(stream.device()).index());
  optim_cuda::launch_lamb_norms(table.data(), norms.data(), static_cast<int>(table.size()), shards.front().grad_type,
                                optim::make_constants(params, shards.front()), handle);
}

void cuda_lamb_apply(const OptimizerParams& params, std::span<const OptimizerStep> shards, std::span<const float* const> norms,
                     Stream& stream) {
  ZEROTH_CHECK(params.kind == OptimizerKind::lamb && norms.size() == shards.size(),
               "cuda_lamb_apply: {} with {} shards and {} norm pairs", optimizer_name(params.kind), shards.size(), norms.size());
  const cudaStream_t handle = checked_stream(params, shards, stream, "cuda_lamb_apply");
  if (shards.empty()) return;
  const auto table = shard_table(shards);
  CudaDeviceGuard guard(static_cast<CudaDevice&>(stream.device()).index());
  optim_cuda::launch_lamb_apply(table.data(), norms.data(), static_cast<int>(table.size()), shards.front().copy_out_type,
                                optim::make_constants(params, shards.front()), handle);
}

StepReport cuda_optimizer_step(const OptimizerParams& params, std::span<const OptimizerStep> shards, Stream& stream) {
  const cudaStream_t handle = checked_stream(params, shards, stream, "cuda_optimizer_step");
  if (shards.empty()) return {};
  const auto& first = shards.front();
  auto& device = stream.device();
  if (first.check_finite) {
    Buffer flag = device.allocate(sizeof(int32_t), MemTag::buffers);
    const int32_t zero = 0;
    device.copy(stream, flag.data(), &zero, sizeof zero);
    for (const auto& s : shards) device.flag_nonfinite(stream, {const_cast<void*>(s.grads), s.count, s.grad_type}, flag.as<int32_t>());
    int32_t found = 0;
    device.copy(stream, &found, flag.data(), sizeof found);
    stream.synchronize();
    if (found != 0) return {.skipped = true};
  }
  if (params.kind == OptimizerKind::lamb) {
    // Each shard is one tensor with a pair of sums of its own; the device frees them on the legacy
    // stream, after this stream's work.
    Buffer sums = device.allocate(2 * shards.size() * sizeof(float), MemTag::buffers);
    device.fill(stream, sums.view(DType::f32), 0.0f);
    std::vector<float*> norms;
    for (size_t k = 0; k < shards.size(); ++k) norms.push_back(sums.as<float>() + 2 * k);
    cuda_lamb_norms(params, shards, norms, stream);
    cuda_lamb_apply(params, shards, std::vector<const float*>(norms.begin(), norms.end()), stream);
    return {};
  }
  const auto table = shard_table(shards);
  CudaDeviceGuard guard(static_cast<CudaDevice&>(device).index());
  optim_cuda::launch_step(optim::kind_of(params), table.data(), static_cast<int>(table.size()), first.grad_type, first.copy_out_type,
                          optim::make_constants(params, first), handle);
  return {};
}

#else

StepReport cuda_optimizer_step(const OptimizerParams&, std::span<const OptimizerStep>, Stream& stream) {
  ZEROTH_THROW(CudaError, "cuda_optimizer_step on {}: zeroth was built without the CUDA backend (-DZEROTH_CUDA=ON)",
               stream.device().name());
}

void cuda_lamb_norms(const OptimizerParams&, std::span<const OptimizerStep>, std::span<float* const>, Stream& stream) {
  ZEROTH_THROW(CudaError, "cuda_lamb_norms on {}: zeroth was built without the CUDA backend (-DZEROTH_CUDA=ON)",
               stream.device().name());
}

void cuda_lamb_apply(const OptimizerParams&, std::span<const OptimizerStep>, std::span<const float* const>, Stream& stream) {
  ZEROTH_THROW(CudaError, "cuda_lamb_apply on {}: zeroth was built without the CUDA backend (-DZEROTH_CUDA=ON)",
               stream.device().name());
}

#endif

}  // namespace zeroth
