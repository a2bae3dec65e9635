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

StepReport cuda_optimizer_step(const OptimizerParams& params, std::span<const OptimizerStep> shards, Stream& stream) {
  auto* cuda_stream = dynamic_cast<CudaStream*>(&stream);
  ZEROTH_CHECK(cuda_stream != nullptr, "cuda_optimizer_step needs a CUDA stream, got one of {}", stream.device().name());
  if (shards.empty()) return {};
  const auto& first = shards.front();
  for (const auto& s : shards) {
    optim::check_step(params, s);
    ZEROTH_CHECK(s.step == first.step && s.lr == first.lr && s.grad_type == first.grad_type &&
                     s.copy_out_type == first.copy_out_type && s.grad_scale == first.grad_scale,
                 "shards of one fused step must share step number, lr, grad scale and dtypes");
  }
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
  std::vector<optim_cuda::Shard> table;
  for (const auto& s : shards) table.push_back({s.params, s.grads, s.state[0], s.state[1], s.copy_out, s.count});
  CudaDeviceGuard guard(static_cast<CudaDevice&>(device).index());
  optim_cuda::launch_step(optim::kind_of(params), table.data(), static_cast<int>(table.size()), first.grad_type,
                          first.copy_out_type, optim::make_constants(params, first), cuda_stream->handle());
  return {};
}

#else

StepReport cuda_optimizer_step(const OptimizerParams&, std::span<const OptimizerStep>, Stream& stream) {
  ZEROTH_THROW(CudaError, "cuda_optimizer_step on {}: zeroth was built without the CUDA backend (-DZEROTH_CUDA=ON)",
               stream.device().name());
}

#endif

}  // namespace zeroth
