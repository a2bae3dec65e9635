// CPU element-wise kernels: feature detection, the one SIMD dispatch point, and the parallel
// (oneTBB) entry points the CPU device and the optimizers call.
#pragma once

#include <cstddef>      // size_t
#include <cstdint>      // uint8_t
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "core/dtype.h"  // DType

namespace zeroth::cpu {

enum class SimdLevel : uint8_t { scalar = 0, avx2 = 1, avx512 = 2 };

struct CpuFeatures {
  std::string brand;
  bool sse42 = false, avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_fp16 = false, amx_bf16 = false;
  bool os_avx = false, os_avx512 = false;  // XSAVE state enabled by the kernel
};

const CpuFeatures& cpu_features();
// Highest level this CPU and OS can run.
SimdLevel best_simd_level();
// The level kernels use: the best, capped by ZEROTH_SIMD (for testing and bisecting).
SimdLevel active_simd_level();
// Every level this machine can run, lowest first.
std::vector<SimdLevel> supported_simd_levels();
std::string_view simd_level_name(SimdLevel level);
SimdLevel parse_simd_level(std::string_view name);

// Elements per parallel chunk. Reductions sum fixed chunks in a fixed order, so results do not
// depend on the number of threads or on the dispatch level.
inline constexpr size_t kChunkElements = size_t{1} << 16;

// Serial kernels for one level. `nt` asks for non-temporal stores (large outputs that are not
// read back soon). sumsq adds x*x into 16 f32 lanes: element i goes to lane i % 16.
struct KernelTable {
  void (*cast)(const void* src, DType src_type, void* dst, DType dst_type, size_t n, bool nt);
  void (*axpy)(void* y, DType y_type, float alpha, const void* x, DType x_type, size_t n);
  void (*scale)(void* x, DType type, float alpha, size_t n);
  void (*sumsq)(const void* x, DType type, size_t n, float lanes[16]);
  bool (*has_nonfinite)(const void* x, DType type, size_t n);
  void (*reduce)(const void* const* inputs, int k, DType in_type, void* out, DType out_type, ReduceKind kind, float scale, size_t n,
                 bool nt);
  void (*copy)(void* dst, const void* src, size_t bytes, bool nt);
};
const KernelTable& kernel_table(SimdLevel level);

// Parallel entry points. Every level gives bit-identical results (no FMA contraction, fixed
// summation order); `level` exists so tests can compare them.
void cast(const void* src, DType src_type, void* dst, DType dst_type, size_t n, SimdLevel level = active_simd_level());
void fill(void* dst, DType type, float value, size_t n);
void copy(void* dst, const void* src, size_t bytes);
// y += alpha * x, computed in f32 and rounded to y's type.
void axpy(void* y, DType y_type, float alpha, const void* x, DType x_type, size_t n, SimdLevel level = active_simd_level());
// x *= alpha
void scale(void* x, DType type, float alpha, size_t n, SimdLevel level = active_simd_level());
// Sum of squares with f32 accumulation inside each chunk; chunks are added in double.
double sum_squares(const void* x, DType type, size_t n, SimdLevel level = active_simd_level());
// sum_squares of f32 values that arrive in consecutive segments (a range streamed through a
// smaller buffer), bit-identical to one sum_squares over their concatenation: the same chunks in
// the same order, a chunk cut between segments carried over (at most kChunkElements values).
class SegmentedSumSquares {
 public:
  void add(const float* x, size_t n);
  double finish();  // the total of everything added since the last finish()

 private:
  std::vector<float> carry_;
  double total_ = 0.0;
};
// True when any element is Inf or NaN.
bool has_nonfinite(const void* x, DType type, size_t n, SimdLevel level = active_simd_level());

// out = scale * sum(inputs) (or the element-wise max, scale ignored), accumulated in f32 in input
// order. `out` may alias one of the inputs (element i is read before it is written).
void reduce(const void* const* inputs, int k, DType in_type, void* out, DType out_type, ReduceKind kind, float scale, size_t n,
            SimdLevel level = active_simd_level());

// Worker threads the kernels may use (ZEROTH_NUM_THREADS, or all cores).
int num_threads();
// Caps kernel parallelism for the rest of the process (benchmarks, tests).
void set_num_threads(int threads);

}  // namespace zeroth::cpu
