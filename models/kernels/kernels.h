// The GPT's kernels behind one small interface, one implementation per device: the CPU's
// (oneDNN or OpenBLAS + oneTBB, cpu/row_kernels.cc) and CUDA's (cuBLAS + the kernels of
// cuda/cuda_backend.cu). The model's block uses are written once against it.
//
// Every pointer is device memory of the backend's device. submit() puts a block use's work in
// stream order: the CPU backend runs it later on the stream's thread, the CUDA backend runs it
// now, launching onto the stream. Semantics of each kernel are those of cpu/row_kernels.h
// (gradient kernels ADD into parameter gradients).
#pragma once

#include <cstddef>     // size_t
#include <cstdint>     // int32_t
#include <functional>  // std::function
#include <memory>      // std::unique_ptr

#include "core/device.h"                     // Device, Stream, TensorView
#include "models/kernels/attention_block.h"  // AttentionBlock

namespace zeroth::gpt {

// A weight matrix as the products get it: its f32 values and, where the run's parameters are
// bf16, the same values as bf16 (a product may then run on bf16 kernels: the weights are the same
// numbers, the activations are rounded to bf16 on the way in). Converts to and from const float*,
// so kernels that only read f32 take it as before.
struct Weight {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  Weight(const float* w) : f32(w) {}  // NOLINT(google-explicit-constructor): an f32 weight is a Weight
  Weight(const float* w, const uint16_t* b) : f32(w), bf16(b) {}
  operator const float*() const { return f32; }  // NOLINT(google-explicit-constructor)
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual void submit(std::function<void()> work) = 0;

  // wte holds vocabulary rows [v_lo, v_lo + V); wpe / dwpe may be null.
  virtual void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C, int v_lo,
                               int V) = 0;
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C, int v_lo,
                                int V) = 0;
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                                 size_t N, int C) = 0;
  // Parameter gradients may be null (a frozen block's): the input's gradient alone (dweight and
  // dbias both null, or neither).
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                                  const float* mean, const float* rstd, size_t N, int C) = 0;
  virtual void matmul_forward(float* out, const float* inp, Weight weight, const float* bias, size_t N, int IC, int OC) = 0;
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, Weight weight, size_t N,
                               int IC, int OC) = 0;
  // qkv [B, T, (NH + 2 KVH) hs]: query heads, then key and value heads (KVH dividing NH). att keeps
  // what the backward needs beyond out: the CPU's blocked attention keeps each row's log-sum-exp
  // (B NH T floats), CUDA's the probabilities (B NH T T floats, with datt scratch of that size;
  // the CPU leaves datt alone): GptConfig::attention_probabilities, set from attention_keeps_probabilities.
  // `products` bf16: a bf16 block's attention, whose products the CPU runs on bf16 operands
  // (cpu/row_kernels.h); CUDA's run in f32 either way.
  virtual void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int KVH, int hs, DType products) = 0;
  virtual void attention_backward(float* dqkv, float* datt, const float* dout, const float* out, const float* qkv, const float* att,
                                  int B, int T, int NH, int KVH, int hs, DType products) = 0;
  // Generation: rows [pos, pos + n) of one sequence's qkv rows [pos + n, W] over rows [0, pos + n).
  virtual void attention_rows(float* out, float* att, const float* qkv, int pos, int n, int NH, int KVH, int hs) = 0;
  // Rows (n, j) of N x groups at n * ld + j * C (cpu/row_kernels.h).
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, size_t N, int groups, int C, size_t ld,
                               float eps) = 0;
  virtual void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                                const float* rstd, size_t N, int groups, int C, size_t ld, bool accumulate) = 0;
  // table: [T, hs] device memory, cosines then sines of each position's angles.
  virtual void rope(float* x, const float* table, size_t N, int T, size_t ld, int heads, int hs, bool inverse) = 0;
  virtual void swiglu_forward(float* out, const float* inp, size_t N, int F) = 0;
  virtual void swiglu_backward(float* dinp, const float* inp, const float* dout, size_t N, int F) = 0;
  virtual void gelu_forward(float* out, const float* inp, size_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) = 0;
  virtual void accumulate(float* y, const float* x, size_t n) = 0;
  virtual void copy(float* dst, const float* src, size_t n) = 0;
  // A block of `cols` columns of `rows` rows between row-major matrices of leading dimensions ldd and
  // lds: dst[r ldd + c] = src[r lds + c], or += with `add` (Ulysses' exchanges pack and unpack heads).
  virtual void copy_columns(float* dst, size_t ldd, const float* src, size_t lds, size_t rows, size_t cols, bool add) = 0;
  // Ring attention (cpu/row_kernels.h): a block's forward and backward (which adds to dq and dkv), and
  // the merge of two normalised outputs over different keys.
  virtual void attention_block_forward(float* out, float* lse, const AttentionBlock& a, DType products) = 0;
  virtual void attention_block_backward(float* dq, float* dkv, const float* dout, const float* out, const float* lse,
                                        const AttentionBlock& a, DType products) = 0;
  virtual void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse, int n, int NH, int hs,
                               size_t lse_ld) = 0;
  virtual void zero(float* x, size_t n) = 0;
  // C [m, n] = alpha op(A) op(B) + beta C in f32, row-major with leading dimensions (op: the
  // matrix or its transpose): BLAS's sgemm on row-major operands, for products over column ranges
  // of other matrices (LoRA's adapters on a fused projection's columns).
  virtual void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
                    float beta, float* c, int ldc) = 0;
  // dst (f32) = src widened; dst (any dtype) += src (f32).
  virtual void widen(TensorView src, float* dst) = 0;
  virtual void add_into(TensorView dst, const float* src) = 0;
  // Cross-entropy over logits [N, V] of the vocabulary entries [v_lo, v_lo + V), in the three steps
  // of cpu/row_kernels.h; `stats` is 3N floats of device memory: max, sums, picked. Between the
  // steps a vocabulary split over ranks takes the max of stats[0, N) and the sum of stats[N, 3N)
  // over them. finish writes each row's loss into row_losses (N floats, device memory); with
  // dlogits_scale != 0 the logits become their gradient times it. gradient makes the same gradient
  // from logits as the product left them and the finished stats: the backward of a loss whose
  // logits were not kept (computed again). A negative target ignores its row (loss and gradient
  // 0). mean_loss writes the sum of N row losses over `divisor` (N, or the counted rows the loss is
  // normalised by) into *loss (host memory, in stream order) and may overwrite row_losses[0].
  virtual void crossentropy_max(const float* logits, size_t N, int V, float* stats) = 0;
  virtual void crossentropy_sums(float* logits, const int32_t* targets, size_t N, int V, int v_lo, float* stats) = 0;
  virtual void crossentropy_finish(float* logits, const int32_t* targets, size_t N, int V, int v_lo, float dlogits_scale, float* stats,
                                   float* row_losses) = 0;
  virtual void crossentropy_gradient(float* logits, const int32_t* targets, size_t N, int V, int v_lo, float dlogits_scale,
                                     const float* stats) = 0;
  virtual void mean_loss(float* row_losses, size_t N, double divisor, float* loss) = 0;
  // Mixture of experts: rows moved to their experts and back (cpu/row_kernels.h; the index arrays
  // are device memory, laid out as moe/router.h's Routing).
  virtual void moe_dispatch(float* out, const float* x, const int32_t* row_token, size_t R, int C) = 0;
  virtual void moe_dispatch_backward(float* dx, const float* drows, const int32_t* row, size_t N, int k, int C) = 0;
  virtual void moe_combine(float* y, const float* rows, const int32_t* row, const float* weight, size_t N, int k, int C) = 0;
  virtual void moe_combine_backward(float* drows, float* dweight, const float* dy, const float* rows, const int32_t* row,
                                    const float* weight, size_t N, int k, int C) = 0;
  // device <- host, in stream order (the host bytes may be reused once the call returns).
  virtual void upload(void* dst, const void* host, size_t bytes) = 0;
  // Inside submitted work: returns when the work before it has completed, so that the host may
  // read what download() wrote (the CPU's work runs in order already; CUDA synchronizes the stream).
  virtual void synchronize() = 0;
  // host <- device, in stream order.
  virtual void download(float* host, const float* src, size_t n) = 0;
};

// Whether the backend of `kind` keeps the attention's probabilities (GptConfig::attention_probabilities).
inline bool attention_keeps_probabilities(DeviceKind kind) { return kind == DeviceKind::cuda; }

// The backend for `stream`'s device. CUDA on a build without it raises CudaError.
std::unique_ptr<Kernels> make_kernels(Stream& stream);

}  // namespace zeroth::gpt
