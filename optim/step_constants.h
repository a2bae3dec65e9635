// What an optimizer step computes once before any kernel runs, and which update it is: shared by
// the CPU kernels and the CUDA kernel (plain C++, so nvcc reads it too).
#pragma once

#ifdef __CUDACC__
#define ZEROTH_STEP_HD __host__ __device__
#else
#define ZEROTH_STEP_HD
#endif

namespace zeroth::optim {

struct StepConstants {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
  float decay_factor;    // adamw / lion: 1 - lr * weight_decay
  float step_size;       // adam: lr / bias_correction1
  float inv_bias2_sqrt;  // adam: 1 / sqrt(bias_correction2)
  float grad_scale;
  float momentum, one_minus_dampening;  // sgd
  bool first_step;                      // sgd: the momentum buffer starts as the gradient
  float lamb_step_size;                 // lamb: lr * sqrt(1 - beta2^step) / (1 - beta1^step) (lr without bias correction)
  float max_coeff, min_coeff;           // lamb: the trust ratio's clamp
  bool eps_inside_sqrt;                 // lamb: sqrt(v + eps) instead of sqrt(v) + eps
};

// lamb: its first pass (moments, squared norms) and its second (the update scaled by the trust
// ratio) are kernels of their own; the one-pass table has no entry for them.
enum class Kind : int { adam_l2, adamw, sgd, sgd_momentum, sgd_nesterov, lion, ceiling, lamb };

// Elements per chunk of Lamb's sums of squares: the CPU and the GPU chunk a range alike (16 lanes
// per chunk folded in a fixed tree, chunks added in order), so their sums agree bit for bit.
inline constexpr unsigned long long kLambChunk = 1ull << 14;

// Lamb's trust ratio of one tensor from its summed squares ||w||^2 and ||u||^2, as DeepSpeed's
// lamb_cuda_kernel_part3 forms it (csrc/lamb/fused_lamb_cuda_kernel.cu, lines 294-303 at
// deepspeedai/DeepSpeed e5d277f): 1 when either norm is 0, else ||w|| / ||u|| clamped to
// max_coeff first, then to min_coeff. Correctly rounded f32 operations, so the host and the GPU
// agree bit for bit.
ZEROTH_STEP_HD inline float lamb_trust_ratio(float w_sq, float u_sq, const StepConstants& c) {
#ifdef __CUDA_ARCH__
  const float w = __fsqrt_rn(w_sq), u = __fsqrt_rn(u_sq);
#else
  const float w = __builtin_sqrtf(w_sq), u = __builtin_sqrtf(u_sq);
#endif
  if (w == 0.0f || u == 0.0f) return 1.0f;
#ifdef __CUDA_ARCH__
  float ratio = __fdiv_rn(w, u);
#else
  float ratio = w / u;
#endif
  if (ratio > c.max_coeff) ratio = c.max_coeff;
  if (ratio < c.min_coeff) ratio = c.min_coeff;
  return ratio;
}

}  // namespace zeroth::optim
