// The CPU's matrix products: one front, two libraries behind it. oneDNN (the library PyTorch's
// CPU path uses) picks its kernels by CPU feature when it runs (AVX2, AVX-512, AVX512-BF16, AMX);
// OpenBLAS's kernel set is fixed when it loads and may sit below the CPU (blas_info.h): on a
// Zen 5 core, OpenBLAS 0.3.21 ran sgemm at 103 GFLOP/s and oneDNN 2.6 at 200. oneDNN is the
// default where the build has it and the CPU has AVX2; ZEROTH_GEMM=openblas selects OpenBLAS.
#pragma once

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

// Threads one product spreads over, for both libraries (models/threads.h's share_cores sets it
// to the rank's share of the cores). The default: OpenBLAS's own (OPENBLAS_NUM_THREADS, or
// every core).
int gemm_threads();
void set_gemm_threads(int threads);

struct SgemmRate {
  int n = 0;           // C(n x n) = A(n x n) B(n x n), single precision
  int reps = 0;        // timed calls after one untimed call
  double gflops = 0;   // median over the timed calls, 2 n^3 flops each
  double seconds = 0;  // median time of one call
};

// Times `library`'s sgemm on square matrices with gemm_threads(). The inputs are small integers,
// so every product is exact in f32: sampled rows of the result are compared with a float64 sum
// and a mismatch raises Error, so kernels that compute wrong results are caught rather than timed.
SgemmRate measure_sgemm(int n, int reps, GemmLibrary library = gemm_library());

}  // namespace zeroth::cpu
