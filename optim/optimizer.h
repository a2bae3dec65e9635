// Optimizers over one flat fp32 shard: Adam, AdamW, SGD (momentum, Nesterov) and Lion, with
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

#include <span>         // std::span

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

#include "core/cpu/kernels.h"  // SimdLevel
#include "core/device.h"       // Stream
#include "core/dtype.h"        // DType

namespace zeroth {

enum class OptimizerKind : uint8_t { adam, adamw, sgd, lion };
std::string_view optimizer_name(OptimizerKind kind);

// Hyper-parameters are doubles, as in the Python frameworks: derived constants such as 1 - beta2
// are formed in double and rounded to f32 once (1 - 0.999f would be 1.3e-5 off).
struct OptimizerParams {
  OptimizerKind kind = OptimizerKind::adamw;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // adam: L2 added to the gradient; adamw, lion: decoupled
  bool bias_correction = true;
  double momentum = 0.0, dampening = 0.0;  // sgd
  bool nesterov = false;

  // State arrays per parameter (see the layout above).
  int state_arrays() const;
  // DeepSpeed's `optimizer` section: {"type": "AdamW", "params": {"lr": ..., "betas": [...], ...}}.
  // Types: Adam (adam_w_mode defaults to true, as in DeepSpeed), AdamW, SGD, Lion; unknown types
  // and keys are ConfigErrors that name them (with a suggestion).
  static OptimizerParams from_deepspeed(const nlohmann::json& section);
  // Range checks (lr >= 0, 0 <= beta < 1, eps > 0, ...); ConfigError naming the key.
  void validate() const;
};

struct OptimizerStep {
  float* params = nullptr;            // fp32 master weights, updated in place
  const void* grads = nullptr;        // f32, bf16 or f16
  DType grad_type = DType::f32;
  float* state[2] = {nullptr, nullptr};
  void* copy_out = nullptr;           // optional: the updated weights in copy_out_type
  DType copy_out_type = DType::bf16;  // bf16 or f16 (f32 is allowed too)
  size_t count = 0;
  int64_t step = 1;                   // 1-based step number (bias correction, SGD's first step)
  double lr = 1e-3;                   // this step's learning rate (from the schedule)
  float grad_scale = 1.0f;            // gradients are multiplied by this first (unscaling, clipping)
  // Look for Inf/NaN in the gradients first and skip the whole step if there is any (one extra
  // read of the gradients). Pass false when the caller has checked already (the engine does).
  bool check_finite = true;
};

struct StepReport {
  bool skipped = false;  // the gradients held Inf or NaN: nothing was written
};

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

// Bytes an Adam-family step must move per parameter (reads + writes), for GB/s figures.
size_t optimizer_bytes_per_param(OptimizerKind kind, DType grad_type, bool copy_out, DType copy_out_type);

}  // namespace zeroth
