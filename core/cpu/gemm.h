// The CPU's matrix products: one front, two libraries behind it. oneDNN (the library PyTorch's
// CPU path uses) picks its kernels by CPU feature when it runs (AVX2, AVX-512, AVX512-BF16, AMX);
// OpenBLAS's kernel set is fixed when it loads and may sit below the CPU (blas_info.h): on a
// Zen 5 core, OpenBLAS 0.3.21 ran sgemm at 103 GFLOP/s and oneDNN 2.6 at 200. oneDNN is the
// default where the build has it and the CPU has AVX2; ZEROTH_GEMM=openblas selects OpenBLAS.
#pragma once

#include <cstddef>      // size_t
#include <cstdint>      // int64_t
#include <string>       // std::string
#include <string_view>  // std::string_view

namespace zeroth::cpu {

enum class GemmLibrary { onednn, openblas };

// Row-major C (M x N) = alpha op(A) op(B) + beta C, where op(X) is X or its transpose, op(A) is
// M x K and op(B) K x N; lda, ldb and ldc are the row strides of A, B and C as stored. beta 0
// ignores what C held (NaN included). InvalidArgument for sizes or strides a BLAS would refuse.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc);
void sgemm(GemmLibrary library, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The same with A and B in bf16 (raw bits), accumulated and written in f32: the products of bf16
// runs. oneDNN runs them on its bf16 kernels (AVX512-BF16, AMX: twice the f32 rate or more; on
// AVX-512 without them, emulated); OpenBLAS has none, nor oneDNN below AVX-512, so there A and B
// are widened and sgemm runs. Each element is the f32 product
// of the exact bf16 values, so the bounds of sgemm hold.
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
               const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm_bf16(GemmLibrary library, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc);
// Whether gemm_bf16 runs faster than widening to f32 would: oneDNN in use on a CPU with bf16
// kernels (AVX512-BF16 or AMX).
bool gemm_bf16_native();

// The library sgemm uses, chosen once: ZEROTH_GEMM where set, else oneDNN where this build has it
// and the CPU has AVX2, else OpenBLAS.
GemmLibrary gemm_library();
// Whether this build can call `library` (OpenBLAS always; oneDNN unless built with
// ZEROTH_ONEDNN=OFF).
bool gemm_library_built(GemmLibrary library);
std::string_view gemm_library_name(GemmLibrary library);
// "onednn" or "openblas"; ConfigError naming ZEROTH_GEMM otherwise.
GemmLibrary parse_gemm_library(std::string_view name);
// One line: "oneDNN 2.6.3, avx512_core_bf16 kernels" or "OpenBLAS 0.3.21, core Haswell".
std::string gemm_library_summary(GemmLibrary library);

// Host memory the library in use holds for a thread's products beyond the operands (packing
// buffers, generated kernels), which the run's estimate counts per rank. oneDNN: 6 MiB, measured
// as the resident set of the configs' runs grew by 4.7-6.6 MiB a rank when their products moved
// from OpenBLAS to oneDNN (tests/tools/estimate_test.cc, 14 configs of 2-4 ranks); OpenBLAS's
// packing (4.5 MiB a rank) is the allowance that test states.
size_t gemm_host_bytes();

// Threads one product spreads over, for both libraries (core/cpu/threads.h's share_cores sets it
// to the rank's share of the cores). The default: OpenBLAS's own (OPENBLAS_NUM_THREADS, or
// every core).
int gemm_threads();
void set_gemm_threads(int threads);

struct GemmRate {
  int n = 0;           // C(n x n) = A(n x n) B(n x n), f32 out
  int reps = 0;        // timed calls after one untimed call
  bool bf16 = false;   // A and B in bf16 (gemm_bf16), else f32 (sgemm)
  double gflops = 0;   // median over the timed calls, 2 n^3 flops each
  double seconds = 0;  // median time of one call
};

// Times `library`'s sgemm (or gemm_bf16) on square matrices with gemm_threads(). The inputs are
// small integers, so every product is exact in f32 and in bf16: sampled rows of the result are
// compared with a float64 sum and a mismatch raises Error, so kernels that compute wrong results
// are caught rather than timed.
GemmRate measure_gemm(int n, int reps, GemmLibrary library = gemm_library(), bool bf16 = false);

}  // namespace zeroth::cpu
