// Optimizers over one flat fp32 shard: Adam, AdamW, SGD (momentum, Nesterov), Lion and Lamb, with
// DeepSpeed's hyper-parameter names. The shard may live on the device, in pinned host memory or
// in a buffer just read from NVMe: a step only needs pointers.
//
// State layout (all f32, one value per parameter, so checkpoints and NVMe swapping can treat it
// as bytes): adam/adamw: state[0] = exp_avg (m), state[1] = exp_avg_sq (v); sgd with momentum:
// state[0] = momentum_buffer; lion: state[0] = exp_avg. Fresh state is all zeros.
#pragma once

#include <cstddef>      // size_t
#include <cstdint>      // int64_t
#include <string>       // std::string
#include <string_view>  // std::string_view

#include <span>  // std::span

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

#include "core/cpu/kernels.h"  // SimdLevel
#include "core/device.h"       // Stream
#include "core/dtype.h"        // DType

namespace zeroth {

enum class OptimizerKind : uint8_t { adam, adamw, sgd, lion, lamb };
std::string_view optimizer_name(OptimizerKind kind);

// Hyper-parameters are doubles, as in the Python frameworks: derived constants such as 1 - beta2
// are formed in double and rounded to f32 once (1 - 0.999f would be 1.3e-5 off).
struct OptimizerParams {
  OptimizerKind kind = OptimizerKind::adamw;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // adam: L2 added to the gradient; adamw, lion: decoupled; lamb: in the update
  bool bias_correction = true;
  double momentum = 0.0, dampening = 0.0;  // sgd
  bool nesterov = false;
  double max_coeff = 10.0, min_coeff = 0.01;  // lamb: the trust ratio's clamp
  bool eps_inside_sqrt = false;               // lamb: sqrt(v + eps) instead of sqrt(v) + eps

  // State arrays per parameter (see the layout above), and their names in PyTorch's optimizer
  // state dicts (exp_avg, exp_avg_sq, momentum_buffer), which checkpoints use.
  int state_arrays() const;
  std::string_view state_array_name(int array) const;
  // DeepSpeed's `optimizer` section: {"type": "AdamW", "params": {"lr": ..., "betas": [...], ...}}.
  // Types: Adam (adam_w_mode defaults to true, as in DeepSpeed), AdamW, SGD, Lion, Lamb; unknown types
  // and keys are ConfigErrors that name them (with a suggestion).
  static OptimizerParams from_deepspeed(const nlohmann::json& section);
  // Range checks (lr >= 0, 0 <= beta < 1, eps > 0, ...); ConfigError naming the key.
  void validate() const;
};

struct OptimizerStep {
  float* params = nullptr;      // fp32 master weights, updated in place
  const void* grads = nullptr;  // f32, bf16 or f16
  DType grad_type = DType::f32;
  float* state[2] = {nullptr, nullptr};
  void* copy_out = nullptr;           // optional: the updated weights in copy_out_type
  DType copy_out_type = DType::bf16;  // bf16 or f16 (f32 is allowed too)
  size_t count = 0;
  int64_t step = 1;         // 1-based step number (bias correction, SGD's first step)
  double lr = 1e-3;         // this step's learning rate (from the schedule)
  float grad_scale = 1.0f;  // gradients are multiplied by this first (unscaling, clipping)
  // Look for Inf/NaN in the gradients first and skip the whole step if there is any (one extra
  // read of the gradients). Pass false when the caller has checked already (the engine does).
  bool check_finite = true;
};

struct StepReport {
  bool skipped = false;  // the gradients held Inf or NaN: nothing was written
};

// Lamb (DeepSpeed's FusedLamb, csrc/lamb/fused_lamb_cuda_kernel.cu): with m, v updated as in Adam,
//   u = m / (sqrt(v) + eps) + weight_decay * w   (the moments as they are, no bias correction)
//   w -= step_size * ratio * u,   step_size = lr * sqrt(1 - beta2^t) / (1 - beta1^t) (lr without
//   bias correction),   ratio = ||w|| / ||u|| over the whole parameter tensor, clamped to
//   [min_coeff, max_coeff]; 1 when either norm is 0.
// The ratio needs norms of a whole tensor, so Lamb takes two passes: lamb_norms updates the moments
// and adds the range's sums of w^2 (weights before the step) and u^2 to norms[0], norms[1];
// lamb_apply recomputes u from the updated moments (the same operations, so the same bits) and
// applies it. Bytes per parameter: pass one reads w, g, m, v and writes m, v; pass two reads w, m,
// v and writes w and the copy-out: 36 + grad + copy-out bytes (AdamW: 24 + grad + copy-out).
// The engine runs pass one over every owned piece of a tensor (ranks and sub-groups split
// tensors), sums the pairs over the data-parallel group, then runs pass two: the ratio is per
// tensor whatever the world size. DeepSpeed with ZeRO applies FusedLamb to each rank's flat
// partition instead, so its ratios (and results) depend on the world size; zeroth's are Lamb as
// defined, as DeepSpeed computes it without ZeRO. cpu_optimizer_step and cuda_optimizer_step take
// each step's range as one whole tensor. The lamb_ functions do not look for Inf/NaN.
void cpu_lamb_norms(const OptimizerParams& params, const OptimizerStep& step, float* norms,
                    cpu::SimdLevel level = cpu::active_simd_level());
void cpu_lamb_apply(const OptimizerParams& params, const OptimizerStep& step, const float* norms,
                    cpu::SimdLevel level = cpu::active_simd_level());
// The same on a CUDA stream, shard k's pair at norms[k] in device memory; the GPU gives the CPU's
// bits (same chunking of the sums). Throws CudaError without the CUDA backend.
void cuda_lamb_norms(const OptimizerParams& params, std::span<const OptimizerStep> shards, std::span<float* const> norms,
                     Stream& stream);
void cuda_lamb_apply(const OptimizerParams& params, std::span<const OptimizerStep> shards, std::span<const float* const> norms,
                     Stream& stream);

// One step on the CPU, parallel over oneTBB, at the dispatcher's SIMD level (every level gives
// the same bits: no FMA contraction, IEEE sqrt and division).
StepReport cpu_optimizer_step(const OptimizerParams& params, const OptimizerStep& step,
                              cpu::SimdLevel level = cpu::active_simd_level());

// Several shards in one fused launch on a CUDA stream (all shards share the step's number, lr,
// grad and copy-out dtypes). With check_finite, the gradients are checked on the GPU first and
// the host waits for the verdict (a synchronization: the engine checks overflow itself instead).
// Throws CudaError without the CUDA backend.
StepReport cuda_optimizer_step(const OptimizerParams& params, std::span<const OptimizerStep> shards, Stream& stream);

// The ceiling for benchmarks: reads and writes exactly what an Adam step does (params, grads,
// both moments, the copy-out) in the same loop, with one addition per array instead of the
// update. A step that runs as fast as this is memory-bound.
void cpu_optimizer_stream_ceiling(const OptimizerStep& step, cpu::SimdLevel level = cpu::active_simd_level());

// Bytes a step must move per parameter (reads + writes, both passes for Lamb), for GB/s figures.
size_t optimizer_bytes_per_param(OptimizerKind kind, DType grad_type, bool copy_out, DType copy_out_type);

}  // namespace zeroth
