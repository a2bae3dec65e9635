// CUDA element-wise kernels: grid-stride loops, dtype dispatch on the host, conversions shared
// bit for bit with the CPU (convert_scalar.inc).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_kernels.h"

namespace zeroth::cuda {
namespace {
#define ZEROTH_HD __host__ __device__
#include "core/cpu/convert_scalar.inc"

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;
constexpr int kReduceBlocks = 1024;  // fixed partial count: the sum order depends on n only

int blocks_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < kMaxBlocks ? (blocks == 0 ? 1 : blocks) : kMaxBlocks);
}

#include "core/cuda/cuda_access.cuh"


#define GRID_STRIDE(i, n) for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < (n); i += size_t{gridDim.x} * blockDim.x)

template <DType T>
__global__ void fill_kernel(void* dst, float value, size_t n) {
  GRID_STRIDE(i, n) store<T>(dst, i, value);
}

template <DType S, DType D>
__global__ void cast_kernel(const void* src, void* dst, size_t n) {
  GRID_STRIDE(i, n) store<D>(dst, i, load<S>(src, i));
}

template <DType T>
__global__ void scale_kernel(void* x, float alpha, size_t n) {
  GRID_STRIDE(i, n) store<T>(x, i, __fmul_rn(load<T>(x, i), alpha));
}

// Explicit _rn intrinsics: no FMA contraction, so results match the CPU kernels bit for bit.
template <DType Y, DType X>
__global__ void axpy_kernel(void* y, float alpha, const void* x, size_t n) {
  GRID_STRIDE(i, n) store<Y>(y, i, __fadd_rn(load<Y>(y, i), __fmul_rn(alpha, load<X>(x, i))));
}

template <int Threads>
__device__ float block_sum(float v) {
  __shared__ float shared[Threads];
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int width = Threads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) shared[threadIdx.x] += shared[threadIdx.x + width];
    __syncthreads();
  }
  return shared[0];
}

template <DType T>
__global__ void sumsq_partial_kernel(const void* x, size_t n, float* partial) {
  float acc = 0.0f;
  GRID_STRIDE(i, n) {
    const float v = load<T>(x, i);
    acc = __fadd_rn(acc, __fmul_rn(v, v));
  }
  const float total = block_sum<kThreads>(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void sumsq_final_kernel(const float* partial, int count, float* out, bool accumulate) {
  __shared__ double shared[kReduceBlocks];
  shared[threadIdx.x] = threadIdx.x < count ? static_cast<double>(partial[threadIdx.x]) : 0.0;
  __syncthreads();
  for (int width = kReduceBlocks / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) shared[threadIdx.x] += shared[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float sum = static_cast<float>(shared[0]);
    *out = accumulate ? *out + sum : sum;
  }
}

template <DType T>
__global__ void nonfinite_kernel(const void* x, size_t n, int32_t* flag) {
  bool found = false;
  GRID_STRIDE(i, n) {
    if constexpr (T == DType::f32) found |= (static_cast<const uint32_t*>(x)[i] & 0x7f800000u) == 0x7f800000u;
    else if constexpr (T == DType::bf16) found |= (static_cast<const uint16_t*>(x)[i] & 0x7f80u) == 0x7f80u;
    else found |= (static_cast<const uint16_t*>(x)[i] & 0x7c00u) == 0x7c00u;
  }
  if (__syncthreads_or(found) && threadIdx.x == 0) *flag = 1;
}

constexpr int kMaxReduceInputs = 16;
struct ReduceInputs {
  const void* ptr[kMaxReduceInputs];
  DType type[kMaxReduceInputs];
};

__device__ inline float load_any(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::bf16: return load<DType::bf16>(p, i);
    case DType::f16: return load<DType::f16>(p, i);
    default: return load<DType::f32>(p, i);
  }
}

// Each element is read from every input before `out` is written, so out may alias an input.
template <DType O, bool Max>
__global__ void reduce_kernel(ReduceInputs in, int k, void* out, float scale, size_t n) {
  GRID_STRIDE(i, n) {
    float acc = load_any(in.ptr[0], in.type[0], i);
    for (int p = 1; p < k; ++p) {
      const float v = load_any(in.ptr[p], in.type[p], i);
      acc = Max ? (acc != acc ? acc : (acc > v ? acc : v)) : __fadd_rn(acc, v);
    }
    if (!Max && scale != 1.0f) acc = __fmul_rn(acc, scale);
    store<O>(out, i, acc);
  }
}

void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    // Plain concatenation: fmt's compile-time format checks do not build under nvcc.
    throw CudaError(std::string("launch of ") + kernel + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ") [" +
                    detail::where(__FILE__, __LINE__) + "]");
  }
}

}  // namespace

void launch_fill(void* dst, DType type, float value, size_t n, cudaStream_t stream) {
  with_dtype(type, [&]<DType T>() { fill_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(dst, value, n); });
  check_launch("fill_kernel");
}

void launch_cast(const void* src, DType src_type, void* dst, DType dst_type, size_t n, cudaStream_t stream) {
  with_dtype(src_type, [&]<DType S>() {
    with_dtype(dst_type, [&]<DType D>() { cast_kernel<S, D><<<blocks_for(n), kThreads, 0, stream>>>(src, dst, n); });
  });
  check_launch("cast_kernel");
}

void launch_scale(void* x, DType type, float alpha, size_t n, cudaStream_t stream) {
  with_dtype(type, [&]<DType T>() { scale_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(x, alpha, n); });
  check_launch("scale_kernel");
}

void launch_axpy(void* y, DType y_type, float alpha, const void* x, DType x_type, size_t n, cudaStream_t stream) {
  with_dtype(y_type, [&]<DType Y>() {
    with_dtype(x_type, [&]<DType X>() { axpy_kernel<Y, X><<<blocks_for(n), kThreads, 0, stream>>>(y, alpha, x, n); });
  });
  check_launch("axpy_kernel");
}

void launch_sum_squares(const void* x, DType type, size_t n, float* out, bool accumulate, cudaStream_t stream) {
  void* scratch = nullptr;
  CUDA_CHECK(cudaMallocAsync(&scratch, kReduceBlocks * sizeof(float), stream));
  auto* partial = static_cast<float*>(scratch);
  const int blocks = std::min(blocks_for(n), kReduceBlocks);
  with_dtype(type, [&]<DType T>() { sumsq_partial_kernel<T><<<blocks, kThreads, 0, stream>>>(x, n, partial); });
  check_launch("sumsq_partial_kernel");
  sumsq_final_kernel<<<1, kReduceBlocks, 0, stream>>>(partial, blocks, out, accumulate);
  check_launch("sumsq_final_kernel");
  CUDA_CHECK(cudaFreeAsync(scratch, stream));
}

void launch_reduce(const void* const* inputs, int k, DType in_type, void* out, DType out_type, bool max, float scale, size_t n,
                   cudaStream_t stream) {
  // More inputs than one launch takes: fold them into an f32 accumulator, a group at a time, in
  // order, and scale only in the last pass (so the result matches a single pass).
  void* scratch = nullptr;
  const bool folded = k > kMaxReduceInputs;
  if (folded) CUDA_CHECK(cudaMallocAsync(&scratch, n * sizeof(float), stream));
  int done = 0;
  while (done < k) {
    ReduceInputs in{};
    int count = 0;
    if (done > 0) {
      in.ptr[count] = scratch;
      in.type[count++] = DType::f32;
    }
    while (count < kMaxReduceInputs && done < k) {
      in.ptr[count] = inputs[done++];
      in.type[count++] = in_type;
    }
    const bool last = done == k;
    void* target = last ? out : scratch;
    const DType target_type = last ? out_type : DType::f32;
    const float pass_scale = last ? scale : 1.0f;
    with_dtype(target_type, [&]<DType O>() {
      if (max) reduce_kernel<O, true><<<blocks_for(n), kThreads, 0, stream>>>(in, count, target, 1.0f, n);
      else reduce_kernel<O, false><<<blocks_for(n), kThreads, 0, stream>>>(in, count, target, pass_scale, n);
    });
    check_launch("reduce_kernel");
  }
  if (folded) CUDA_CHECK(cudaFreeAsync(scratch, stream));
}

void launch_flag_nonfinite(const void* x, DType type, size_t n, int32_t* flag, cudaStream_t stream) {
  with_dtype(type, [&]<DType T>() { nonfinite_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(x, n, flag); });
  check_launch("nonfinite_kernel");
}

}  // namespace zeroth::cuda
