// What the GPT's CUDA kernel files share: launch shapes and warp/block reductions in a fixed order.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>  // size_t

namespace zeroth::gpt {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

unsigned blocks_for(size_t n, int threads = kThreads) { return static_cast<unsigned>((n + threads - 1) / threads); }

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <class Op>
__device__ float warp_reduce(float v, Op op) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ float warp_sum(float v) { return warp_reduce(v, Sum{}); }
__device__ float warp_max(float v) { return warp_reduce(v, Max{}); }

// Block-wide reduction (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <class Op>
__device__ float block_reduce(float v, Op op, float identity) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_reduce(v, op);
  __syncthreads();  // the previous reduction's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_reduce(lane < warps ? partial[lane] : identity, op);
}

}  // namespace
}  // namespace zeroth::gpt
