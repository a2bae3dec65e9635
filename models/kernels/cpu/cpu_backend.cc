// The GPT's CPU backend: the kernels of row_kernels.cc, run on the stream's thread.
#include <cstring>  // std::memcpy

#include "core/cpu/gemm.h"                   // cpu::sgemm
#include "core/cpu/kernels.h"                // cpu::cast, cpu::axpy, cpu::fill
#include "core/error.h"                      // ZEROTH_THROW
#include "models/kernels/cpu/row_kernels.h"  // gpt::cpu::*
#include "models/kernels/kernels.h"

namespace zeroth::gpt {
namespace {

class CpuKernels final : public Kernels {
 public:
  explicit CpuKernels(Stream& stream) : stream_(stream) {}
  void submit(std::function<void()> work) override { stream_.enqueue_host(std::move(work)); }

  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C, int v_lo,
                       int V) override {
    cpu::encoder_forward(out, tokens, wte, wpe, B, T, C, v_lo, V);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C, int v_lo,
                        int V) override {
    cpu::encoder_backward(dwte, dwpe, dout, tokens, B, T, C, v_lo, V);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias, size_t N,
                         int C) override {
    cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                          const float* mean, const float* rstd, size_t N, int C) override {
    cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, Weight weight, const float* bias, size_t N, int IC, int OC) override {
    cpu::matmul_forward(out, inp, weight.f32, bias, N, IC, OC, weight.bf16);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, Weight weight, size_t N, int IC,
                       int OC) override {
    cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight.f32, N, IC, OC, weight.bf16);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int KVH, int hs, DType products) override {
    cpu::attention_forward(out, att, qkv, B, T, NH, KVH, hs, products);
  }
  void attention_rows(float* out, float* att, const float* qkv, int pos, int n, int NH, int KVH, int hs) override {
    cpu::attention_rows(out, att, qkv, pos, n, NH, KVH, hs);
  }
  void attention_backward(float* dqkv, float* /*datt*/, const float* dout, const float* out, const float* qkv, const float* att, int B,
                          int T, int NH, int KVH, int hs, DType products) override {
    cpu::attention_backward(dqkv, dout, out, qkv, att, B, T, NH, KVH, hs, products);
  }
  void attention_block_forward(float* out, float* lse, const AttentionBlock& a, DType products) override {
    cpu::attention_block_forward(out, lse, a, products);
  }
  void attention_block_backward(float* dq, float* dkv, const float* dout, const float* out, const float* lse, const AttentionBlock& a,
                                DType products) override {
    cpu::attention_block_backward(dq, dkv, dout, out, lse, a, products);
  }
  void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse, int n, int NH, int hs,
                       size_t lse_ld) override {
    cpu::attention_merge(out, lse, block_out, block_lse, n, NH, hs, lse_ld);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, size_t N, int groups, int C, size_t ld,
                       float eps) override {
    cpu::rmsnorm_forward(out, rstd, inp, weight, N, groups, C, ld, eps);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight, const float* rstd,
                        size_t N, int groups, int C, size_t ld, bool accumulate) override {
    cpu::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, groups, C, ld, accumulate);
  }
  void rope(float* x, const float* table, size_t N, int T, size_t ld, int heads, int hs, bool inverse) override {
    cpu::rope(x, table, N, T, ld, heads, hs, inverse);
  }
  void swiglu_forward(float* out, const float* inp, size_t N, int F) override { cpu::swiglu_forward(out, inp, N, F); }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, size_t N, int F) override {
    cpu::swiglu_backward(dinp, inp, dout, N, F);
  }
  void gelu_forward(float* out, const float* inp, size_t n) override { cpu::gelu_forward(out, inp, n); }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override { cpu::gelu_backward(dinp, inp, dout, n); }
  void moe_dispatch(float* out, const float* x, const int32_t* row_token, size_t R, int C) override {
    cpu::moe_dispatch(out, x, row_token, R, C);
  }
  void moe_dispatch_backward(float* dx, const float* drows, const int32_t* row, size_t N, int k, int C) override {
    cpu::moe_dispatch_backward(dx, drows, row, N, k, C);
  }
  void moe_combine(float* y, const float* rows, const int32_t* row, const float* weight, size_t N, int k, int C) override {
    cpu::moe_combine(y, rows, row, weight, N, k, C);
  }
  void moe_combine_backward(float* drows, float* dweight, const float* dy, const float* rows, const int32_t* row, const float* weight,
                            size_t N, int k, int C) override {
    cpu::moe_combine_backward(drows, dweight, dy, rows, row, weight, N, k, C);
  }
  void accumulate(float* y, const float* x, size_t n) override { cpu::accumulate(y, x, n); }
  void copy(float* dst, const float* src, size_t n) override { std::memcpy(dst, src, n * sizeof(float)); }
  void copy_columns(float* dst, size_t ldd, const float* src, size_t lds, size_t rows, size_t cols, bool add) override {
    for (size_t r = 0; r < rows; ++r) {
      if (add) cpu::accumulate(dst + r * ldd, src + r * lds, cols);
      else std::memcpy(dst + r * ldd, src + r * lds, cols * sizeof(float));
    }
  }
  void zero(float* x, size_t n) override { zeroth::cpu::fill(x, DType::f32, 0.0f, n); }
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
            float* c, int ldc) override {
    zeroth::cpu::sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void widen(TensorView src, float* dst) override { zeroth::cpu::cast(src.data, src.dtype, dst, DType::f32, src.numel); }
  void add_into(TensorView dst, const float* src) override {
    zeroth::cpu::axpy(dst.data, dst.dtype, 1.0f, src, DType::f32, dst.numel);
  }
  void crossentropy_max(const float* logits, size_t N, int V, float* stats) override { cpu::crossentropy_max(logits, N, V, stats); }
  void crossentropy_sums(float* logits, const int32_t* targets, size_t N, int V, int v_lo, float* stats) override {
    cpu::crossentropy_sums(logits, targets, N, V, v_lo, stats, stats + N, stats + 2 * N);
  }
  void crossentropy_finish(float* logits, const int32_t* targets, size_t N, int V, int v_lo, float dlogits_scale, float* stats,
                           float* row_losses) override {
    cpu::crossentropy_finish(logits, targets, N, V, v_lo, stats, stats + N, stats + 2 * N, dlogits_scale, row_losses);
  }
  void crossentropy_gradient(float* logits, const int32_t* targets, size_t N, int V, int v_lo, float dlogits_scale,
                             const float* stats) override {
    cpu::crossentropy_gradient(logits, targets, N, V, v_lo, stats, stats + N, dlogits_scale);
  }
  void mean_loss(float* row_losses, size_t N, double divisor, float* loss) override {
    double sum = 0;
    for (size_t n = 0; n < N; ++n) sum += row_losses[n];
    *loss = static_cast<float>(sum / divisor);
  }
  void download(float* host, const float* src, size_t n) override { std::memcpy(host, src, n * sizeof(float)); }
  void upload(void* dst, const void* host, size_t bytes) override { std::memcpy(dst, host, bytes); }
  void synchronize() override {}

 private:
  Stream& stream_;
};

}  // namespace

#ifndef ZEROTH_WITH_CUDA
std::unique_ptr<Kernels> make_cuda_kernels(Stream&) {
  ZEROTH_THROW(CudaError, "the GPT's CUDA kernels are not in this build (configure with -DZEROTH_CUDA=ON on a machine with nvcc)");
}
#else
std::unique_ptr<Kernels> make_cuda_kernels(Stream& stream);
#endif

std::unique_ptr<Kernels> make_kernels(Stream& stream) {
  if (stream.device().kind() == DeviceKind::cuda) return make_cuda_kernels(stream);
  return std::make_unique<CpuKernels>(stream);
}

}  // namespace zeroth::gpt
