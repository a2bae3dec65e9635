// The fused optimizer step on the GPU: every array is read once and written once per step, with
// the CPU kernels' operation order and IEEE-rounded intrinsics (no FMA contraction), so a GPU
// step gives the CPU's bits.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/cuda/cuda_check.h"
#include "optim/cuda/optim_cuda.h"

namespace zeroth::optim_cuda {
namespace {
#define ZEROTH_HD __host__ __device__
#include "core/cpu/convert_scalar.inc"

using optim::Kind;
using optim::StepConstants;

struct Shards {
  Shard s[kMaxShards];
};

#include "core/cuda/cuda_access.cuh"

__device__ inline float sign(float a) { return a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : (a != a ? a : 0.0f)); }

template <Kind K>
__device__ inline void update(float& p, float g, float& m, float& v, const StepConstants& c) {
  if constexpr (K == Kind::ceiling) {
    p = __fadd_rn(p, g);
    m = __fadd_rn(m, g);
    v = __fadd_rn(v, g);
  } else if constexpr (K == Kind::adam_l2 || K == Kind::adamw) {
    if constexpr (K == Kind::adam_l2) g = __fadd_rn(g, __fmul_rn(c.weight_decay, p));
    if constexpr (K == Kind::adamw) p = __fmul_rn(p, c.decay_factor);
    m = __fadd_rn(__fmul_rn(m, c.beta1), __fmul_rn(g, c.one_minus_beta1));
    v = __fadd_rn(__fmul_rn(v, c.beta2), __fmul_rn(__fmul_rn(g, g), c.one_minus_beta2));
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), c.inv_bias2_sqrt), c.eps);
    p = __fsub_rn(p, __fmul_rn(c.step_size, __fdiv_rn(m, denom)));
  } else if constexpr (K == Kind::lion) {
    const float blend = __fadd_rn(__fmul_rn(m, c.beta1), __fmul_rn(g, c.one_minus_beta1));
    p = __fmul_rn(p, c.decay_factor);
    p = __fsub_rn(p, __fmul_rn(c.lr, sign(blend)));
    m = __fadd_rn(__fmul_rn(m, c.beta2), __fmul_rn(g, c.one_minus_beta2));
  } else {
    g = __fadd_rn(g, __fmul_rn(c.weight_decay, p));
    if constexpr (K == Kind::sgd) {
      p = __fsub_rn(p, __fmul_rn(c.lr, g));
    } else {
      m = c.first_step ? g : __fadd_rn(__fmul_rn(m, c.momentum), __fmul_rn(g, c.one_minus_dampening));
      const float direction = K == Kind::sgd_nesterov ? __fadd_rn(g, __fmul_rn(c.momentum, m)) : m;
      p = __fsub_rn(p, __fmul_rn(c.lr, direction));
    }
  }
}

__host__ __device__ constexpr bool uses_m(Kind k) { return k != Kind::sgd; }
__host__ __device__ constexpr bool uses_v(Kind k) { return k == Kind::adam_l2 || k == Kind::adamw || k == Kind::ceiling; }

template <Kind K, DType G, bool Copy, DType O>
__global__ void step_kernel(Shards shards, StepConstants c) {
  const Shard& s = shards.s[blockIdx.y];
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < s.count; i += size_t{gridDim.x} * blockDim.x) {
    float p = s.params[i];
    float m = uses_m(K) ? s.m[i] : 0.0f, v = uses_v(K) ? s.v[i] : 0.0f;
    const float g = __fmul_rn(load<G>(s.grads, i), c.grad_scale);
    update<K>(p, g, m, v, c);
    s.params[i] = p;
    if constexpr (uses_m(K)) s.m[i] = m;
    if constexpr (uses_v(K)) s.v[i] = v;
    if constexpr (Copy) store<O>(s.out, i, p);
  }
}


template <Kind K>
void launch_kind(const Shards& shards, int count, size_t longest, DType gt, bool copy, DType ot, const StepConstants& c,
                 cudaStream_t stream) {
  constexpr int kThreads = 256;
  const size_t blocks = std::min<size_t>(4096, (longest + kThreads - 1) / kThreads);
  const dim3 grid(static_cast<unsigned>(std::max<size_t>(blocks, 1)), static_cast<unsigned>(count));
  with_dtype(gt, [&]<DType G>() {
    if (!copy) return step_kernel<K, G, false, DType::f32><<<grid, kThreads, 0, stream>>>(shards, c);
    with_dtype(ot, [&]<DType O>() { step_kernel<K, G, true, O><<<grid, kThreads, 0, stream>>>(shards, c); });
  });
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw CudaError(std::string("launch of the optimizer step kernel failed: ") + cudaGetErrorName(err) + " (" +
                    cudaGetErrorString(err) + ")");
  }
}

}  // namespace

void launch_step(Kind kind, const Shard* shards, int count, DType grad_type, DType out_type, const StepConstants& c,
                 cudaStream_t stream) {
  for (int first = 0; first < count; first += kMaxShards) {
    Shards batch{};
    const int n = std::min(kMaxShards, count - first);
    size_t longest = 0;
    bool copy = false;
    for (int k = 0; k < n; ++k) {
      batch.s[k] = shards[first + k];
      longest = std::max(longest, batch.s[k].count);
      copy = batch.s[k].out != nullptr;
    }
    if (longest == 0) continue;
    switch (kind) {
      case Kind::adam_l2: launch_kind<Kind::adam_l2>(batch, n, longest, grad_type, copy, out_type, c, stream); break;
      case Kind::adamw: launch_kind<Kind::adamw>(batch, n, longest, grad_type, copy, out_type, c, stream); break;
      case Kind::sgd: launch_kind<Kind::sgd>(batch, n, longest, grad_type, copy, out_type, c, stream); break;
      case Kind::sgd_momentum: launch_kind<Kind::sgd_momentum>(batch, n, longest, grad_type, copy, out_type, c, stream); break;
      case Kind::sgd_nesterov: launch_kind<Kind::sgd_nesterov>(batch, n, longest, grad_type, copy, out_type, c, stream); break;
      case Kind::lion: launch_kind<Kind::lion>(batch, n, longest, grad_type, copy, out_type, c, stream); break;
      case Kind::ceiling: launch_kind<Kind::ceiling>(batch, n, longest, grad_type, copy, out_type, c, stream); break;
    }
  }
}

}  // namespace zeroth::optim_cuda
