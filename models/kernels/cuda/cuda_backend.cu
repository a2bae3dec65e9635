// The GPT's CUDA backend: cuBLAS for every product (row-major tensors as column-major
// transposes, as llm.c does), and kernels for the rest: one warp per row for LayerNorm, softmax
// and cross-entropy, one thread per column for the parameter-gradient sums. No atomics: every
// sum is added in a fixed order, so a step gives the same bits every time.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>  // std::string

#include "core/cuda/cuda_check.h"               // CUDA_CHECK
#include "core/cuda/cuda_device.h"              // CudaStream, CudaDeviceGuard
#include "core/cuda/cuda_kernels.h"             // cuda::launch_cast, launch_axpy
#include "models/kernels/cuda/cuda_common.cuh"  // kThreads, kWarp, blocks_for, warp and block reductions
#include "models/kernels/cuda/moe.h"            // launch_moe_*
#include "models/kernels/kernels.h"

#define CUBLAS_CHECK(call)                                                                                                      \
  do {                                                                                                                          \
    const cublasStatus_t zeroth_cublas_status_ = (call);                                                                        \
    if (zeroth_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                                                          \
      throw ::zeroth::CudaError(std::string(#call) + " failed: cuBLAS status " + std::to_string(zeroth_cublas_status_) + " [" + \
                                ::zeroth::detail::where(__FILE__, __LINE__) + "]");                                             \
    }                                                                                                                           \
  } while (0)

#include "models/kernels/cuda/encoder.cuh"
#include "models/kernels/cuda/layernorm.cuh"
#include "models/kernels/cuda/bias.cuh"
#include "models/kernels/cuda/gelu.cuh"
#include "models/kernels/cuda/rmsnorm.cuh"
#include "models/kernels/cuda/rope.cuh"
#include "models/kernels/cuda/swiglu.cuh"
#include "models/kernels/cuda/columns.cuh"
#include "models/kernels/cuda/softmax.cuh"
#include "models/kernels/cuda/crossentropy.cuh"

namespace zeroth::gpt {
namespace {

class CudaKernels final : public Kernels {
 public:
  explicit CudaKernels(Stream& stream)
      : stream_(dynamic_cast<CudaStream&>(stream)), index_(static_cast<CudaDevice&>(stream.device()).index()) {
    CudaDeviceGuard guard(index_);
    CUBLAS_CHECK(cublasCreate(&handle_));
    CUBLAS_CHECK(cublasSetStream(handle_, stream_.handle()));
    // Plain fp32 products: the reference tests compare with PyTorch at f32 tolerances.
    CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
  }
  ~CudaKernels() override {
    CudaDeviceGuard guard(index_);
    cublasDestroy(handle_);
  }

  void submit(std::function<void()> work) override {
    CudaDeviceGuard guard(index_);
    work();
    CUDA_CHECK(cudaGetLastError());
  }

  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C, int v_lo,
                       int V) override {
    const size_t n = static_cast<size_t>(B) * T * C;
    encoder_forward_kernel<<<blocks_for(n), kThreads, 0, s()>>>(out, tokens, wte, wpe, T, C, v_lo, V, n);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C, int v_lo,
                        int V) override {
    encoder_backward_wte_kernel<<<static_cast<unsigned>(B * T), kThreads, 0, s()>>>(dwte, dout, tokens, C, B * T, v_lo, V);
    if (dwpe != nullptr)
      encoder_backward_wpe_kernel<<<blocks_for(static_cast<size_t>(T) * C), kThreads, 0, s()>>>(dwpe, dout, B, T, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias, size_t N,
                         int C) override {
    layernorm_forward_kernel<<<blocks_for(N * kWarp), kThreads, 0, s()>>>(out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                          const float* mean, const float* rstd, size_t N, int C) override {
    if (dweight != nullptr)  // a frozen block's norm: its input's gradient only
      layernorm_backward_params_kernel<<<blocks_for(C), kThreads, 0, s()>>>(dweight, dbias, dout, inp, mean, rstd, N, C);
    layernorm_backward_input_kernel<<<blocks_for(N * kWarp), kThreads, 0, s()>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, Weight weight, const float* bias, size_t N, int IC, int OC) override {
    float beta = 0.0f;
    if (bias != nullptr) {
      bias_rows_kernel<<<blocks_for(N * OC), kThreads, 0, s()>>>(out, bias, OC, N * OC);
      beta = 1.0f;
    }
    const float one = 1.0f;
    CUBLAS_CHECK(
        cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, OC, static_cast<int>(N), IC, &one, weight.f32, IC, inp, IC, &beta, out, OC));
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, Weight weight, size_t N, int IC,
                       int OC) override {
    const float one = 1.0f, zero = 0.0f;
    const int n = static_cast<int>(N);
    if (dinp != nullptr)
      CUBLAS_CHECK(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, IC, n, OC, &one, weight.f32, IC, dout, OC, &zero, dinp, IC));
    if (dweight != nullptr)
      CUBLAS_CHECK(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, n, &one, inp, IC, dout, OC, &one, dweight, IC));
    if (dbias != nullptr) column_sum_kernel<<<blocks_for(OC), kThreads, 0, s()>>>(dbias, dout, N, OC);
  }
  // Query heads are batched in groups that share one key/value operand: with multi-head attention
  // one group of all heads (the shared operand strided by a head), with grouped-query attention one
  // group per key/value head (the shared operand with stride 0). The key and value gradients of
  // grouped heads sum their query heads' in head order (beta 1 after the first), so a step gives
  // the same bits every time.
  struct Groups {
    int count, heads;         // groups, query heads per group
    long long shared_stride;  // between the group's heads in the key/value operand
  };
  static Groups groups_of(int NH, int KVH, int hs) { return NH == KVH ? Groups{1, NH, hs} : Groups{KVH, NH / KVH, 0}; }
  // f32 products whatever `products` asks (kernels.h).
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int KVH, int hs,
                         DType /*products*/) override {
    const int W = (NH + 2 * KVH) * hs, Cq = NH * hs;
    const Groups G = groups_of(NH, KVH, hs);
    const float scale = 1.0f / sqrtf(static_cast<float>(hs)), zero = 0.0f, one = 1.0f;
    const long long TT = static_cast<long long>(T) * T;
    for (int b = 0; b < B; ++b) {
      const float* row = qkv + static_cast<size_t>(b) * T * W;
      for (int j = 0; j < G.count; ++j) {
        // att^T (keys x queries) = K Q^T per query head
        CUBLAS_CHECK(cublasSgemmStridedBatched(handle_, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &scale, row + (NH + j) * hs, W,
                                               G.shared_stride, row + j * G.heads * hs, W, hs, &zero,
                                               att + (static_cast<size_t>(b) * NH + j * G.heads) * TT, T, TT, G.heads));
      }
    }
    const size_t rows = static_cast<size_t>(B) * NH * T;
    causal_softmax_kernel<<<blocks_for(rows * kWarp), kThreads, 0, s()>>>(att, rows, T, T, 0);
    for (int b = 0; b < B; ++b) {
      const float* row = qkv + static_cast<size_t>(b) * T * W;
      for (int j = 0; j < G.count; ++j) {
        // y^T (hs x T) = V^T P^T per query head
        CUBLAS_CHECK(cublasSgemmStridedBatched(handle_, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &one, row + (NH + KVH + j) * hs, W,
                                               G.shared_stride, att + (static_cast<size_t>(b) * NH + j * G.heads) * TT, T, TT, &zero,
                                               out + static_cast<size_t>(b) * T * Cq + j * G.heads * hs, Cq, hs, G.heads));
      }
    }
  }
  void attention_rows(float* out, float* att, const float* qkv, int pos, int n, int NH, int KVH, int hs) override {
    const int W = (NH + 2 * KVH) * hs, Cq = NH * hs, Tk = pos + n;
    const Groups G = groups_of(NH, KVH, hs);
    const float scale = 1.0f / sqrtf(static_cast<float>(hs)), zero = 0.0f, one = 1.0f;
    const long long block = static_cast<long long>(n) * Tk;
    for (int j = 0; j < G.count; ++j) {
      // att^T (keys x queries) = K Q^T per query head, the queries the last n rows
      CUBLAS_CHECK(cublasSgemmStridedBatched(handle_, CUBLAS_OP_T, CUBLAS_OP_N, Tk, n, hs, &scale, qkv + (NH + j) * hs, W,
                                             G.shared_stride, qkv + static_cast<size_t>(pos) * W + j * G.heads * hs, W, hs, &zero,
                                             att + j * G.heads * block, Tk, block, G.heads));
    }
    const size_t rows = static_cast<size_t>(NH) * n;
    causal_softmax_kernel<<<blocks_for(rows * kWarp), kThreads, 0, s()>>>(att, rows, Tk, n, pos);
    for (int j = 0; j < G.count; ++j) {
      CUBLAS_CHECK(cublasSgemmStridedBatched(handle_, CUBLAS_OP_N, CUBLAS_OP_N, hs, n, Tk, &one, qkv + (NH + KVH + j) * hs, W,
                                             G.shared_stride, att + j * G.heads * block, Tk, block, &zero, out + j * G.heads * hs, Cq,
                                             hs, G.heads));
    }
  }
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* /*out*/, const float* qkv, const float* att, int B,
                          int T, int NH, int KVH, int hs, DType /*products*/) override {
    const int W = (NH + 2 * KVH) * hs, Cq = NH * hs, g = NH / KVH;
    const Groups G = groups_of(NH, KVH, hs);
    const float scale = 1.0f / sqrtf(static_cast<float>(hs)), zero = 0.0f, one = 1.0f;
    const long long TT = static_cast<long long>(T) * T;
    // dK or dV of every key/value head at `shared` from the query heads' (dS^T Q or att^T dy):
    // batched when each has one query head, else summed over its group in head order.
    auto key_value_grad = [&](const float* by, int by_ld, const float* mats, float* shared) {
      if (g == 1) {
        CUBLAS_CHECK(cublasSgemmStridedBatched(handle_, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &one, by, by_ld, hs, mats, T, TT, &zero,
                                               shared, W, hs, NH));
        return;
      }
      for (int h = 0; h < NH; ++h) {
        CUBLAS_CHECK(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &one, by + h * hs, by_ld, mats + h * TT, T,
                                 h % g == 0 ? &zero : &one, shared + h / g * hs, W));
      }
    };
    for (int b = 0; b < B; ++b) {
      const float* base = qkv + static_cast<size_t>(b) * T * W;
      const float* dy = dout + static_cast<size_t>(b) * T * Cq;
      float* da = datt + static_cast<size_t>(b) * NH * TT;
      for (int j = 0; j < G.count; ++j) {
        // datt = dy V^T: (datt)^T = V dy^T
        CUBLAS_CHECK(cublasSgemmStridedBatched(handle_, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &one, base + (NH + KVH + j) * hs, W,
                                               G.shared_stride, dy + j * G.heads * hs, Cq, hs, &zero, da + j * G.heads * TT, T, TT,
                                               G.heads));
      }
      // dV = att^T dy: (dV)^T = dy^T att
      key_value_grad(dy, Cq, att + static_cast<size_t>(b) * NH * TT, dqkv + static_cast<size_t>(b) * T * W + (NH + KVH) * hs);
    }
    const size_t rows = static_cast<size_t>(B) * NH * T;
    softmax_backward_kernel<<<blocks_for(rows * kWarp), kThreads, 0, s()>>>(datt, att, rows, T, scale);
    for (int b = 0; b < B; ++b) {
      const float* base = qkv + static_cast<size_t>(b) * T * W;
      const float* da = datt + static_cast<size_t>(b) * NH * TT;
      float* dbase = dqkv + static_cast<size_t>(b) * T * W;
      for (int j = 0; j < G.count; ++j) {
        // dQ = dS K: (dQ)^T = K^T dS^T
        CUBLAS_CHECK(cublasSgemmStridedBatched(handle_, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &one, base + (NH + j) * hs, W,
                                               G.shared_stride, da + j * G.heads * TT, T, TT, &zero, dbase + j * G.heads * hs, W, hs,
                                               G.heads));
      }
      // dK = dS^T Q: (dK)^T = Q^T dS
      key_value_grad(base, W, da, dbase + NH * hs);
    }
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, size_t N, int groups, int C, size_t ld,
                       float eps) override {
    const size_t rows = N * groups;
    rmsnorm_forward_kernel<<<blocks_for(rows * kWarp), kThreads, 0, s()>>>(out, rstd, inp, weight, rows, groups, C, ld, eps);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight, const float* rstd,
                        size_t N, int groups, int C, size_t ld, bool accumulate) override {
    const size_t rows = N * groups;
    if (dweight != nullptr)
      rmsnorm_backward_weight_kernel<<<blocks_for(C), kThreads, 0, s()>>>(dweight, dout, inp, rstd, rows, groups, C, ld);
    rmsnorm_backward_input_kernel<<<blocks_for(rows * kWarp), kThreads, 0, s()>>>(dinp, dout, inp, weight, rstd, rows, groups, C, ld,
                                                                                  accumulate);
  }
  void rope(float* x, const float* table, size_t N, int T, size_t ld, int heads, int hs, bool inverse) override {
    const size_t n = N * heads * (hs / 2);
    rope_kernel<<<blocks_for(n), kThreads, 0, s()>>>(x, table, N, T, ld, heads, hs, inverse ? -1.0f : 1.0f);
  }
  void swiglu_forward(float* out, const float* inp, size_t N, int F) override {
    swiglu_forward_kernel<<<blocks_for(N * F), kThreads, 0, s()>>>(out, inp, N, F);
  }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, size_t N, int F) override {
    swiglu_backward_kernel<<<blocks_for(N * F), kThreads, 0, s()>>>(dinp, inp, dout, N, F);
  }
  void gelu_forward(float* out, const float* inp, size_t n) override {
    gelu_forward_kernel<<<blocks_for(n), kThreads, 0, s()>>>(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    gelu_backward_kernel<<<blocks_for(n), kThreads, 0, s()>>>(dinp, inp, dout, n);
  }
  void moe_dispatch(float* out, const float* x, const int32_t* row_token, size_t R, int C) override {
    launch_moe_dispatch(out, x, row_token, R, C, s());
  }
  void moe_dispatch_backward(float* dx, const float* drows, const int32_t* row, size_t N, int k, int C) override {
    launch_moe_dispatch_backward(dx, drows, row, N, k, C, s());
  }
  void moe_combine(float* y, const float* rows, const int32_t* row, const float* weight, size_t N, int k, int C) override {
    launch_moe_combine(y, rows, row, weight, N, k, C, s());
  }
  void moe_combine_backward(float* drows, float* dweight, const float* dy, const float* rows, const int32_t* row, const float* weight,
                            size_t N, int k, int C) override {
    launch_moe_combine_backward(drows, dweight, dy, rows, row, weight, N, k, C, s());
  }
  void accumulate(float* y, const float* x, size_t n) override { cuda::launch_axpy(y, DType::f32, 1.0f, x, DType::f32, n, s()); }
  void copy(float* dst, const float* src, size_t n) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, s()));
  }
  // Ring attention is refused on CUDA before a model is built (Gpt's check of its part): these say so
  // to a caller that reached them some other way.
  [[noreturn]] static void no_ring() {
    throw ConfigError(
        "ring attention (parallel.context) has no CUDA kernels: run it on the cpu device, or split long windows over GPUs with "
        "parallel.sequence (Ulysses)");
  }
  void attention_block_forward(float*, float*, const AttentionBlock&, DType) override { no_ring(); }
  void attention_block_backward(float*, float*, const float*, const float*, const float*, const AttentionBlock&, DType) override {
    no_ring();
  }
  void attention_merge(float*, float*, const float*, const float*, int, int, int, size_t) override { no_ring(); }
  void copy_columns(float* dst, size_t ldd, const float* src, size_t lds, size_t rows, size_t cols, bool add) override {
    if (rows == 0 || cols == 0) return;
    if (!add) {
      CUDA_CHECK(cudaMemcpy2DAsync(dst, ldd * sizeof(float), src, lds * sizeof(float), cols * sizeof(float), rows,
                                   cudaMemcpyDeviceToDevice, s()));
      return;
    }
    add_columns_kernel<<<blocks_for(rows * cols), kThreads, 0, s()>>>(dst, ldd, src, lds, rows, cols);
    CUDA_CHECK(cudaGetLastError());
  }
  void zero(float* x, size_t n) override { CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), s())); }
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
            float* c, int ldc) override {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the operands swapped.
    CUBLAS_CHECK(cublasSgemm(handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                             ldb, a, lda, &beta, c, ldc));
  }
  void widen(TensorView src, float* dst) override { cuda::launch_cast(src.data, src.dtype, dst, DType::f32, src.numel, s()); }
  void add_into(TensorView dst, const float* src) override {
    cuda::launch_axpy(dst.data, dst.dtype, 1.0f, src, DType::f32, dst.numel, s());
  }
  void crossentropy_max(const float* logits, size_t N, int V, float* stats) override {
    crossentropy_max_kernel<<<static_cast<unsigned>(N), 1024, 0, s()>>>(logits, stats, V);
  }
  void crossentropy_sums(float* logits, const int32_t* targets, size_t N, int V, int v_lo, float* stats) override {
    crossentropy_sums_kernel<<<static_cast<unsigned>(N), 1024, 0, s()>>>(logits, targets, stats, N, V, v_lo);
  }
  void crossentropy_finish(float* logits, const int32_t* targets, size_t N, int V, int v_lo, float dlogits_scale, float* stats,
                           float* row_losses) override {
    crossentropy_finish_kernel<<<static_cast<unsigned>(N), 1024, 0, s()>>>(logits, targets, stats, row_losses, N, V, v_lo,
                                                                           dlogits_scale);
  }
  void crossentropy_gradient(float* logits, const int32_t* targets, size_t N, int V, int v_lo, float dlogits_scale,
                             const float* stats) override {
    crossentropy_gradient_kernel<<<static_cast<unsigned>(N), 1024, 0, s()>>>(logits, targets, stats, N, V, v_lo, dlogits_scale);
  }
  void mean_loss(float* row_losses, size_t N, double divisor, float* loss) override {
    // The mean goes to row_losses[0]: every row loss is read before thread 0 writes it.
    mean_kernel<<<1, 1024, 0, s()>>>(row_losses, row_losses, N, static_cast<float>(divisor));
    CUDA_CHECK(cudaMemcpyAsync(loss, row_losses, sizeof(float), cudaMemcpyDeviceToHost, s()));
  }
  void upload(void* dst, const void* host, size_t bytes) override {
    if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, s()));
  }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(s())); }
  void download(float* host, const float* src, size_t n) override {
    CUDA_CHECK(cudaMemcpyAsync(host, src, n * sizeof(float), cudaMemcpyDeviceToHost, s()));
  }

 private:
  cudaStream_t s() const { return stream_.handle(); }
  CudaStream& stream_;
  int index_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace

std::unique_ptr<Kernels> make_cuda_kernels(Stream& stream) { return std::make_unique<CudaKernels>(stream); }

}  // namespace zeroth::gpt
