// cuBLAS loaded on its first call, not at start. Linked, libcublas's and libcublasLt's initializers
// run in every `zeroth` start, GPU or not: measured here, 0.09 s and 217 MiB of resident memory for
// an empty program linked to them, against 0.00 s and 1 MiB. zeroth calls six of its functions;
// defined here with their header's signatures, each finds its namesake in the library, opened once
// (libcublas.so.N from the library path, else the toolkit's folder this zeroth was built against).
#include <cublas_v2.h>
#include <dlfcn.h>  // dlopen, dlsym, dlerror

#include <mutex>   // std::call_once
#include <string>  // std::string

#include "core/error.h"  // ZEROTH_THROW

namespace zeroth::cuda {
namespace {

#define ZEROTH_CUBLAS_SONAME_(major) "libcublas.so." #major
#define ZEROTH_CUBLAS_SONAME(major) ZEROTH_CUBLAS_SONAME_(major)

void* library() {
  static std::once_flag once;
  static void* handle = nullptr;
  static std::string error;
  std::call_once(once, [] {
    const char* name = ZEROTH_CUBLAS_SONAME(CUBLAS_VER_MAJOR);
    handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) return;
    error = ::dlerror();
    const std::string beside = std::string(ZEROTH_CUDA_LIBRARY_DIR) + "/" + name;
    handle = ::dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) error += "; " + std::string(::dlerror());
  });
  if (handle == nullptr)
    ZEROTH_THROW(CudaError, "dlopen(\"{}\"): {} (put cuBLAS {}'s folder on LD_LIBRARY_PATH)", ZEROTH_CUBLAS_SONAME(CUBLAS_VER_MAJOR),
                 error, CUBLAS_VER_MAJOR);
  return handle;
}

template <typename F>
F symbol(F, const char* name) {
  void* s = ::dlsym(library(), name);
  if (s == nullptr) ZEROTH_THROW(CudaError, "dlsym(\"{}\") in {}: {}", name, ZEROTH_CUBLAS_SONAME(CUBLAS_VER_MAJOR), ::dlerror());
  return reinterpret_cast<F>(s);
}

}  // namespace
}  // namespace zeroth::cuda

// The function's own pointer, found once.
#define ZEROTH_CUBLAS(name)                                               \
  static const auto zeroth_real = ::zeroth::cuda::symbol(&::name, #name); \
  return zeroth_real

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) { ZEROTH_CUBLAS(cublasCreate_v2)(handle); }

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) { ZEROTH_CUBLAS(cublasDestroy_v2)(handle); }

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  ZEROTH_CUBLAS(cublasSetStream_v2)(handle, stream);
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  ZEROTH_CUBLAS(cublasSetMathMode)(handle, mode);
}

cublasStatus_t CUBLASWINAPI cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                                           int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                                           const float* beta, float* C, int ldc) {
  ZEROTH_CUBLAS(cublasSgemm_v2)(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

cublasStatus_t CUBLASWINAPI cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                                      int n, int k, const float* alpha, const float* A, int lda, long long int strideA,
                                                      const float* B, int ldb, long long int strideB, const float* beta, float* C,
                                                      int ldc, long long int strideC, int batchCount) {
  ZEROTH_CUBLAS(cublasSgemmStridedBatched)
  (handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC, batchCount);
}

}  // extern "C"
