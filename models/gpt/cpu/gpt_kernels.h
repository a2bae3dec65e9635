// The GPT's CPU kernels, in f32: GEMMs through OpenBLAS, everything else over oneTBB with loops
// the compiler vectorizes per ISA. Shapes follow llm.c: N = B*T rows of C channels; weights are
// [out, in] as in torch.nn.Linear. Every gradient kernel ADDS into parameter gradients (a block
// may be used twice per micro-step) and overwrites activation gradients unless it says otherwise.
#pragma once

#include <cstddef>  // size_t
#include <cstdint>  // int32_t

namespace zeroth::gpt::cpu {

// out[n, c] = wte[tokens[n], c] + wpe[n % T, c]
void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C);
// dwte[tokens[n]] += dout[n]; dwpe[t] += sum over b of dout[b, t]
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C);

// out = (inp - mean) * rstd * weight + bias, per row; mean and rstd [N] are kept for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias, size_t N,
                       int C);
// dinp += ..., dweight += ..., dbias += ... (dinp accumulates: it is the residual stream).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                        const float* mean, const float* rstd, size_t N, int C);

// out[N, OC] = inp[N, IC] x weight[OC, IC]^T + bias
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, size_t N, int IC, int OC);
// dinp = dout x weight (overwritten), dweight += dout^T x inp, dbias += column sums of dout.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, size_t N,
                     int IC, int OC);

// Causal self-attention over qkv [B, T, 3C] (q, k, v each C = NH heads of C/NH). att [B, NH, T, T]
// keeps the probabilities (zero above the diagonal); out is [B, T, C].
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// dqkv is overwritten; datt is scratch of att's size.
void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int B, int T, int C, int NH);

// GELU, tanh approximation (GPT-2's).
void gelu_forward(float* out, const float* inp, size_t n);
// dinp = gelu'(inp) * dout
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

// out = a + b
void residual_forward(float* out, const float* a, const float* b, size_t n);
// y += x
void accumulate(float* y, const float* x, size_t n);

// Cross-entropy of softmax(logits) against targets, per row of V. Returns the sum of the rows'
// losses (double). With dlogits_scale != 0 the logits are overwritten by their gradient:
// (softmax - onehot) * dlogits_scale. Targets outside [0, V) are errors raised by the caller.
double crossentropy(float* logits, const int32_t* targets, size_t N, int V, float dlogits_scale);

}  // namespace zeroth::gpt::cpu
