// The GPT's CPU kernels, in f32: GEMMs through core/cpu/gemm.h (oneDNN or OpenBLAS), everything else over oneTBB with loops
// the compiler vectorizes per ISA. Shapes follow llm.c: N = B*T rows of C channels; weights are
// [out, in] as in torch.nn.Linear. Every gradient kernel ADDS into parameter gradients (a block
// may be used twice per micro-step) and overwrites activation gradients unless it says otherwise.
#pragma once

#include <cstddef>  // size_t
#include <cstdint>  // int32_t

#include "core/dtype.h"                      // DType
#include "models/kernels/attention_block.h"  // AttentionBlock

namespace zeroth::gpt::cpu {

// out[n, c] = wte[tokens[n] - v_lo, c] + wpe[n % T, c]: wte holds the vocabulary rows [v_lo, v_lo +
// V) (a tensor-parallel slice), a token outside them adds 0, and wpe may be null (not added).
void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C, int v_lo, int V);
// dwte[tokens[n] - v_lo] += dout[n] for the tokens in [v_lo, v_lo + V); dwpe[t] += sum over b of
// dout[b, t] (dwpe may be null).
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C, int v_lo, int V);

// out = (inp - mean) * rstd * weight + bias, per row; mean and rstd [N] are kept for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias, size_t N,
                       int C);
// dinp += ..., dweight += ..., dbias += ... (dinp accumulates: it is the residual stream).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                        const float* mean, const float* rstd, size_t N, int C);

// out[N, OC] = inp[N, IC] x weight[OC, IC]^T + bias. weight_bf16, when given, holds the same
// weights as bf16 and makes this a bf16 product: inp is rounded to bf16 and the products are
// accumulated and written in f32 (PyTorch's bf16 autocast rounds its inputs alike, and its outputs
// too), on oneDNN's bf16 kernels where the CPU has them
// (cpu::gemm_bf16_native), else in f32 on the same values.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, size_t N, int IC, int OC,
                    const uint16_t* weight_bf16 = nullptr);
// dinp = dout x weight (overwritten), dweight += dout^T x inp, dbias += column sums of dout; a null
// dinp or dweight is not computed (an expert's input gradient leaves before its weights' are made).
// With weight_bf16, dout and inp are rounded to bf16 for both products.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, size_t N,
                     int IC, int OC, const uint16_t* weight_bf16 = nullptr);

// Causal self-attention over qkv [B, T, (NH + 2 KVH) hs]: NH query heads, then KVH key heads and
// KVH value heads of hs channels each; key/value head j serves query heads j g .. j g + g - 1
// (g = NH / KVH: grouped-query attention; KVH = NH is multi-head attention). out is [B, T, NH hs];
// lse [B, NH, T] keeps each row's log-sum-exp of its scaled scores for backward. Runs by blocks
// with an online softmax (attention.cc): no T x T matrix is held.
// `products` bf16 (a bf16 run's attention, as PyTorch's bf16 attention rounds): every product
// takes its operands rounded to bf16, nearest even (queries, keys, values, the output gradient,
// and the probabilities and score gradients as they are made), and accumulates in f32, on
// AVX512-BF16 where the CPU has it; the softmax, its sums and every output stay f32. An odd head
// size runs f32. f32: every product in f32.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int KVH, int hs, DType products = DType::f32);
// Generation with a key/value cache: rows [pos, pos + n) of qkv [pos + n, (NH + 2 KVH) hs] (one
// sequence) attend causally over rows [0, pos + n); out [n, NH hs] is what attention_forward gives
// for those rows of the whole sequence, in f32 (a bf16 run's generation too: rounding the whole
// cache for each new row would cost as much as the row's attention). att is scratch of NH n
// floats (the rows' log-sum-exp).
void attention_rows(float* out, float* att, const float* qkv, int pos, int n, int NH, int KVH, int hs);
// How attention_backward splits its work: one pass, a task per key/value head; or two, dK and dV
// by chunks of keys, then dQ by blocks of queries (more tasks, two more products a block and
// chunk). Both give the same bits; by default it takes two where batch x key/value heads is below
// the threads.
enum class AttentionPasses { by_threads, one, two };
// dqkv is overwritten (a key/value head's gradient sums its query heads', in head order) from dout,
// and the forward's out and lse; `products` as the forward's.
void attention_backward(float* dqkv, const float* dout, const float* out, const float* qkv, const float* lse, int B, int T, int NH,
                        int KVH, int hs, DType products = DType::f32, AttentionPasses passes = AttentionPasses::by_threads);

// out [n, NH hs] normalised over the block's keys, and lse [NH] rows of n, lse_ld apart.
void attention_block_forward(float* out, float* lse, const AttentionBlock& a, DType products = DType::f32);
// The block's share of the gradients, added to dq (rows as the queries) and dkv (rows as kv), from
// dout and the whole attention's out and lse (over every block of keys: lse_ld apart), which make its
// probabilities as attention_backward does.
void attention_block_backward(float* dq, float* dkv, const float* dout, const float* out, const float* lse, const AttentionBlock& a,
                              DType products = DType::f32, AttentionPasses passes = AttentionPasses::by_threads);
// out, lse (NH rows lse_ld apart) become the attention over both sets of keys, from theirs and
// another set's block_out and block_lse ([NH] rows of n): the online softmax's merge of two
// normalised outputs.
void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse, int n, int NH, int hs, size_t lse_ld);

// RMSNorm (Zhang and Sennrich 2019, as Llama computes it): out = x * rstd * weight with rstd =
// 1 / sqrt(mean(x^2) + eps), over rows of C channels. Row (n, j) of N x groups starts at n * ld + j * C
// in inp and out (groups 1, ld C: a [N, C] tensor; per-head norms read heads inside wider rows);
// rstd [N x groups] is kept for backward. weight [C] serves every row.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, size_t N, int groups, int C, size_t ld,
                     float eps);
// dinp (the same layout as inp) += ... with `accumulate` (the residual stream), = ... without; dweight += ...
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight, const float* rstd,
                      size_t N, int groups, int C, size_t ld, bool accumulate);

// Rotary position embedding in Hugging Face's rotate-half layout, in place: in row n (position
// n mod T) of x, each of `heads` heads of hs channels at n * ld + h * hs has its pairs (i, i + hs/2)
// rotated by the angle whose cosine and sine are table[t * hs + i] and table[t * hs + hs/2 + i].
// `inverse` rotates back (the transpose: backward turns the gradient at the rotated values into
// the gradient at the values before it).
void rope(float* x, const float* table, size_t N, int T, size_t ld, int heads, int hs, bool inverse);

// SwiGLU: out[n, j] = silu(inp[n, j]) * inp[n, F + j] over rows [gate (F) | up (F)] of inp [N, 2F].
void swiglu_forward(float* out, const float* inp, size_t N, int F);
// dinp [N, 2F] = the gradients at gate and up (overwritten).
void swiglu_backward(float* dinp, const float* inp, const float* dout, size_t N, int F);

// GELU, tanh approximation (GPT-2's).
void gelu_forward(float* out, const float* inp, size_t n);
// dinp = gelu'(inp) * dout
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

// out = a + b
void residual_forward(float* out, const float* a, const float* b, size_t n);
// y += x
void accumulate(float* y, const float* x, size_t n);

// Mixture of experts (models/moe/router.h's Routing): choice j of token n is entry n k + j of
// row[] and weight[]; row -1 is a dropped choice. Each kept choice has a row of its own among the
// R dispatched rows, and row_token[r] is the token row r holds.
// out[r] = x[row_token[r]] for r < R.
void moe_dispatch(float* out, const float* x, const int32_t* row_token, size_t R, int C);
// dx[n] += sum over n's kept choices of drows[row[n k + j]].
void moe_dispatch_backward(float* dx, const float* drows, const int32_t* row, size_t N, int k, int C);
// y[n] = sum over n's kept choices of weight[n k + j] x rows[row[n k + j]] (0 when none is kept).
void moe_combine(float* y, const float* rows, const int32_t* row, const float* weight, size_t N, int k, int C);
// drows[row[n k + j]] = weight[n k + j] x dy[n]; dweight[n k + j] = dy[n] . rows[row[n k + j]], 0
// for a dropped choice. Rows no choice names are not written.
void moe_combine_backward(float* drows, float* dweight, const float* dy, const float* rows, const int32_t* row, const float* weight,
                          size_t N, int k, int C);

// Cross-entropy of softmax(logits) against targets, in three steps so that the vocabulary may be
// split over ranks (Megatron-LM's vocabulary-parallel loss): the logits [N, V] are the vocabulary
// entries [v_lo, v_lo + V); between the steps the caller combines the ranks' max (step 1) and
// sums (step 2). A negative target ignores its row: loss 0 and gradient 0 (the loss mask of
// prompts, padding and sample boundaries). Other targets outside the whole vocabulary are errors
// raised by the caller.
// 1. max[n] = the row's largest logit.
void crossentropy_max(const float* logits, size_t N, int V, float* max);
// 2. sums[n] = sum of exp(logit - max[n]), which the logits become; picked[n] = the target's logit
//    where this slice holds it, else 0.
void crossentropy_sums(float* logits, const int32_t* targets, size_t N, int V, int v_lo, const float* max, float* sums, float* picked);
// 3. losses[n] = log(sums) + max - picked, the row's loss. With dlogits_scale != 0 the logits (exp
//    values from step 2) become their gradient, (softmax - onehot) * dlogits_scale.
void crossentropy_finish(float* logits, const int32_t* targets, size_t N, int V, int v_lo, const float* max, const float* sums,
                         const float* picked, float dlogits_scale, float* losses);
// Step 3's gradient from the logits themselves (as a product made them again) and the finished max
// and sums: the same exp and the same scaling as steps 2 and 3, so the same bits.
void crossentropy_gradient(float* logits, const int32_t* targets, size_t N, int V, int v_lo, const float* max, const float* sums,
                           float dlogits_scale);

}  // namespace zeroth::gpt::cpu
