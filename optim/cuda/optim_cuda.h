// Launcher of the fused CUDA optimizer kernel (optim_cuda.cu); plain C++ for host callers.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>  // size_t

#include "core/dtype.h"
#include "optim/step_constants.h"  // StepConstants, Kind

namespace zeroth::optim_cuda {

struct Shard {
  float* params;
  const void* grads;
  float* m;
  float* v;
  void* out;
  size_t count;
};

// One launch updates up to kMaxShards shards (blockIdx.y picks the shard); more are split into
// several launches. The arithmetic is the CPU kernels', operation for operation.
inline constexpr int kMaxShards = 16;
void launch_step(optim::Kind kind, const Shard* shards, int count, DType grad_type, DType out_type, const optim::StepConstants& c,
                 cudaStream_t stream);

// Lamb's two passes (optim/optimizer.h) over up to any number of shards; norms[k] is shard k's pair
// (sum of w^2, sum of u^2) in device memory: pass one adds to it, in shard order; pass two reads it.
void launch_lamb_norms(const Shard* shards, float* const* norms, int count, DType grad_type, const optim::StepConstants& c,
                       cudaStream_t stream);
void launch_lamb_apply(const Shard* shards, const float* const* norms, int count, DType out_type, const optim::StepConstants& c,
                       cudaStream_t stream);

}  // namespace zeroth::optim_cuda
