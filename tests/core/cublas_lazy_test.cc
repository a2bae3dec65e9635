// cuBLAS against the dynamic loader's own record: the library is not in the process until zeroth's
// first cuBLAS call, and that call reaches the real library (its status, not a loading error).
#include <gtest/gtest.h>

#include <cublas_v2.h>
#include <dlfcn.h>

#include <string>

namespace zeroth {
namespace {

// libcublas, or with `lt` libcublasLt (whose initializers were most of the cost), in the process.
bool loaded(bool lt = false) {
  const std::string name = std::string(lt ? "libcublasLt.so." : "libcublas.so.") + std::to_string(CUBLAS_VER_MAJOR);
  void* h = ::dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h != nullptr) ::dlclose(h);  // NOLOAD took a reference
  return h != nullptr;
}

TEST(CublasLazy, TheLibraryIsOpenedByTheFirstCallNotAtStart) {
  ASSERT_FALSE(loaded()) << "libcublas is in the process before any cuBLAS call: linked rather than loaded on use";
  ASSERT_FALSE(loaded(/*lt=*/true)) << "libcublasLt is in the process before any cuBLAS call";
  cublasHandle_t handle = nullptr;
  const cublasStatus_t status = cublasCreate(&handle);  // no GPU: the library says so
  EXPECT_TRUE(loaded());
  if (status == CUBLAS_STATUS_SUCCESS) {
    EXPECT_EQ(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
  } else {
    EXPECT_EQ(status, CUBLAS_STATUS_NOT_INITIALIZED) << "cuBLAS's own answer without a usable GPU";
  }
}

}  // namespace
}  // namespace zeroth
