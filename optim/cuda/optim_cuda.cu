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


// Lamb, operation for operation as optim/cpu/optim_body.inc (lamb_moments, lamb_direction).
struct LambShards {
  Shard s[kMaxShards];
  float* norms[kMaxShards];
  float* partial[kMaxShards];  // pass one: two floats per chunk
};

__device__ inline float lamb_direction(float p, float m, float v, const StepConstants& c) {
  const float denom = c.eps_inside_sqrt ? __fsqrt_rn(__fadd_rn(v, c.eps)) : __fadd_rn(__fsqrt_rn(v), c.eps);
  return __fadd_rn(__fdiv_rn(m, denom), __fmul_rn(c.weight_decay, p));
}

// One thread per (chunk, lane) of a shard: lane l of a chunk takes its elements l, l + 16, ... in
// order, as the CPU's lanes do; the 16 lanes of a chunk (half a warp) then fold in the CPU's tree.
// Every thread reaches the shuffles, so the full mask holds.
template <DType G>
__global__ void lamb_norms_kernel(LambShards shards, StepConstants c) {
  const Shard& s = shards.s[blockIdx.y];
  const size_t t = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  const size_t chunk = t / 16, lane = t % 16;
  const size_t begin = chunk * optim::kLambChunk, end = begin + optim::kLambChunk < s.count ? begin + optim::kLambChunk : s.count;
  float w = 0.0f, u = 0.0f;
  for (size_t i = begin + lane; i < end; i += 16) {
    const float p = s.params[i];
    const float g = __fmul_rn(load<G>(s.grads, i), c.grad_scale);
    const float m = __fadd_rn(__fmul_rn(c.beta1, s.m[i]), __fmul_rn(c.one_minus_beta1, g));
    const float v = __fadd_rn(__fmul_rn(c.beta2, s.v[i]), __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
    s.m[i] = m;
    s.v[i] = v;
    const float d = lamb_direction(p, m, v, c);
    w = __fadd_rn(w, __fmul_rn(p, p));
    u = __fadd_rn(u, __fmul_rn(d, d));
  }
  for (int width = 8; width >= 1; width /= 2) {
    w = __fadd_rn(w, __shfl_down_sync(0xffffffffu, w, width, 16));
    u = __fadd_rn(u, __shfl_down_sync(0xffffffffu, u, width, 16));
  }
  if (lane == 0 && begin < s.count) {
    shards.partial[blockIdx.y][2 * chunk] = w;
    shards.partial[blockIdx.y][2 * chunk + 1] = u;
  }
}

// The chunks of each shard in order in f64, added to the shard's pair in f32; one thread, in shard
// order, because shards may share a pair.
__global__ void lamb_norms_finish_kernel(LambShards shards, int count) {
  for (int k = 0; k < count; ++k) {
    const size_t chunks = (shards.s[k].count + optim::kLambChunk - 1) / optim::kLambChunk;
    if (chunks == 0) continue;
    double w = 0.0, u = 0.0;
    for (size_t q = 0; q < chunks; ++q) {
      w = __dadd_rn(w, static_cast<double>(shards.partial[k][2 * q]));
      u = __dadd_rn(u, static_cast<double>(shards.partial[k][2 * q + 1]));
    }
    shards.norms[k][0] = __fadd_rn(shards.norms[k][0], __double2float_rn(w));
    shards.norms[k][1] = __fadd_rn(shards.norms[k][1], __double2float_rn(u));
  }
}

template <bool Copy, DType O>
__global__ void lamb_apply_kernel(LambShards shards, StepConstants c) {
  const Shard& s = shards.s[blockIdx.y];
  const float* norms = shards.norms[blockIdx.y];
  const float lr_ratio = __fmul_rn(c.lamb_step_size, optim::lamb_trust_ratio(norms[0], norms[1], c));
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < s.count; i += size_t{gridDim.x} * blockDim.x) {
    const float p = __fsub_rn(s.params[i], __fmul_rn(lr_ratio, lamb_direction(s.params[i], s.m[i], s.v[i], c)));
    s.params[i] = p;
    if constexpr (Copy) {
      if (s.out != nullptr) store<O>(s.out, i, p);
    }
  }
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw CudaError(std::string("launch of ") + what + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
}

// Batches of kMaxShards: fn(batch, n, longest count, any copy-out).
template <class Fn>
void for_batches(const Shard* shards, int count, Fn&& fn) {
  for (int first = 0; first < count; first += kMaxShards) {
    const int n = std::min(kMaxShards, count - first);
    size_t longest = 0;
    bool copy = false;
    for (int k = 0; k < n; ++k) {
      longest = std::max(longest, shards[first + k].count);
      copy = copy || shards[first + k].out != nullptr;
    }
    if (longest > 0) fn(first, n, longest, copy);
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

constexpr int kLambThreads = 256;

}  // namespace

void launch_lamb_norms(const Shard* shards, float* const* norms, int count, DType grad_type, const StepConstants& c,
                       cudaStream_t stream) {
  for_batches(shards, count, [&](int first, int n, size_t longest, bool) {
    LambShards batch{};
    size_t partials = 0;
    for (int k = 0; k < n; ++k) partials += 2 * ((shards[first + k].count + optim::kLambChunk - 1) / optim::kLambChunk);
    void* scratch = nullptr;
    CUDA_CHECK(cudaMallocAsync(&scratch, partials * sizeof(float), stream));
    float* at = static_cast<float*>(scratch);
    for (int k = 0; k < n; ++k) {
      batch.s[k] = shards[first + k];
      batch.norms[k] = norms[first + k];
      batch.partial[k] = at;
      at += 2 * ((shards[first + k].count + optim::kLambChunk - 1) / optim::kLambChunk);
    }
    const size_t threads = (longest + optim::kLambChunk - 1) / optim::kLambChunk * 16;
    const dim3 grid(static_cast<unsigned>((threads + kLambThreads - 1) / kLambThreads), static_cast<unsigned>(n));
    with_dtype(grad_type, [&]<DType G>() { lamb_norms_kernel<G><<<grid, kLambThreads, 0, stream>>>(batch, c); });
    check_launch("lamb_norms_kernel");
    lamb_norms_finish_kernel<<<1, 1, 0, stream>>>(batch, n);
    check_launch("lamb_norms_finish_kernel");
    CUDA_CHECK(cudaFreeAsync(scratch, stream));
  });
}

void launch_lamb_apply(const Shard* shards, const float* const* norms, int count, DType out_type, const StepConstants& c,
                       cudaStream_t stream) {
  for_batches(shards, count, [&](int first, int n, size_t longest, bool copy) {
    LambShards batch{};
    for (int k = 0; k < n; ++k) {
      batch.s[k] = shards[first + k];
      batch.norms[k] = const_cast<float*>(norms[first + k]);
    }
    const size_t blocks = std::min<size_t>(4096, (longest + kLambThreads - 1) / kLambThreads);
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(n));
    if (!copy) {
      lamb_apply_kernel<false, DType::f32><<<grid, kLambThreads, 0, stream>>>(batch, c);
    } else {
      with_dtype(out_type, [&]<DType O>() { lamb_apply_kernel<true, O><<<grid, kLambThreads, 0, stream>>>(batch, c); });
    }
    check_launch("lamb_apply_kernel");
  });
}

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
      case Kind::lamb: throw CudaError("launch_step: Lamb runs as launch_lamb_norms then launch_lamb_apply");
    }
  }
}

}  // namespace zeroth::optim_cuda
