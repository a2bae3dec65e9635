// The CPU optimizer step: constants once per step, then fixed chunks over oneTBB, each a single
// pass of the dispatched kernel.
#include <tbb/parallel_for.h>

#include <vector>  // std::vector

#include "core/cpu/parallel.h"  // for_chunks
#include "core/error.h"
#include "optim/cpu/optim_kernels.h"
#include "optim/optimizer.h"
#include "optim/step_setup.h"

namespace zeroth {

namespace optim_cpu {
const OptimTable& optim_table_scalar();
const OptimTable& optim_table_avx2();
const OptimTable& optim_table_avx512();

const OptimTable& optim_table(cpu::SimdLevel level) {
  ZEROTH_CHECK(level <= cpu::best_simd_level(), "SIMD level {} is not supported by this CPU", cpu::simd_level_name(level));
  switch (level) {
    case cpu::SimdLevel::avx512: return optim_table_avx512();
    case cpu::SimdLevel::avx2: return optim_table_avx2();
    case cpu::SimdLevel::scalar: break;
  }
  return optim_table_scalar();
}
}  // namespace optim_cpu

namespace {

using optim::Kind;
using optim::StepConstants;

// Outputs this large go around the cache (the copy-out is not read back by the step).
constexpr size_t kStreamingBytes = size_t{8} << 20;
// Elements per task: 16 KiB of each f32 array, so the five streams of a chunk stay in L2.
constexpr size_t kChunk = size_t{1} << 14;

void run(Kind kind, const OptimizerStep& s, const StepConstants& c, cpu::SimdLevel level) {
  const auto& table = optim_cpu::optim_table(level);
  const bool nt = s.copy_out != nullptr && s.count * dtype_size(s.copy_out_type) >= kStreamingBytes;
  const size_t gsize = dtype_size(s.grad_type), osize = dtype_size(s.copy_out_type);
  auto body = [&](size_t b, size_t e) {
    table.step(static_cast<int>(kind), s.params + b, static_cast<const char*>(s.grads) + b * gsize, s.grad_type,
               s.state[0] ? s.state[0] + b : nullptr, s.state[1] ? s.state[1] + b : nullptr,
               s.copy_out ? static_cast<char*>(s.copy_out) + b * osize : nullptr, s.copy_out_type, e - b, c, nt);
  };
  const size_t chunks = (s.count + kChunk - 1) / kChunk;
  if (chunks <= 1) {
    if (s.count > 0) body(0, s.count);
    return;
  }
  cpu::num_threads();  // applies ZEROTH_NUM_THREADS before the first parallel region
  tbb::parallel_for(tbb::blocked_range<size_t>(0, chunks, 1), [&](const tbb::blocked_range<size_t>& r) {
    for (size_t k = r.begin(); k != r.end(); ++k) body(k * kChunk, std::min(s.count, (k + 1) * kChunk));
  });
}

// Elements of a chunk's step and offsets into its arrays.
struct Chunk {
  const OptimizerStep& s;
  size_t b;
  float* params() const { return s.params + b; }
  const void* grads() const { return static_cast<const char*>(s.grads) + b * dtype_size(s.grad_type); }
  float* m() const { return s.state[0] + b; }
  float* v() const { return s.state[1] + b; }
  void* out() const { return s.copy_out ? static_cast<char*>(s.copy_out) + b * dtype_size(s.copy_out_type) : nullptr; }
};

}  // namespace

void cpu_lamb_norms(const OptimizerParams& params, const OptimizerStep& s, float* norms, cpu::SimdLevel level) {
  ZEROTH_CHECK(params.kind == OptimizerKind::lamb, "cpu_lamb_norms with {}", optimizer_name(params.kind));
  optim::check_step(params, s);
  if (s.count == 0) return;
  const auto& table = optim_cpu::optim_table(level);
  const StepConstants c = optim::make_constants(params, s);
  // Per chunk, the lanes fold in a fixed tree in f32 (as core's sum of squares); chunks add in
  // order in f64: the sums depend on neither the SIMD level nor the thread count.
  constexpr size_t chunk = optim::kLambChunk;
  std::vector<double> partial(2 * ((s.count + chunk - 1) / chunk));
  cpu::for_chunks(s.count, chunk, [&](size_t b, size_t e) {
    const Chunk at{s, b};
    float lanes[2][16] = {};
    table.lamb_norms(at.params(), at.grads(), s.grad_type, at.m(), at.v(), e - b, c, lanes);
    for (auto& l : lanes) {
      for (int width = 8; width >= 1; width /= 2) {
        for (int i = 0; i < width; ++i) l[i] += l[i + width];
      }
    }
    partial[2 * (b / chunk)] = lanes[0][0];
    partial[2 * (b / chunk) + 1] = lanes[1][0];
  });
  double w_sq = 0, u_sq = 0;
  for (size_t k = 0; k < partial.size(); k += 2) w_sq += partial[k], u_sq += partial[k + 1];
  norms[0] += static_cast<float>(w_sq);
  norms[1] += static_cast<float>(u_sq);
}

void cpu_lamb_apply(const OptimizerParams& params, const OptimizerStep& s, const float* norms, cpu::SimdLevel level) {
  ZEROTH_CHECK(params.kind == OptimizerKind::lamb, "cpu_lamb_apply with {}", optimizer_name(params.kind));
  optim::check_step(params, s);
  if (s.count == 0) return;
  const auto& table = optim_cpu::optim_table(level);
  const StepConstants c = optim::make_constants(params, s);
  const float lr_ratio = c.lamb_step_size * optim::lamb_trust_ratio(norms[0], norms[1], c);
  const bool nt = s.copy_out != nullptr && s.count * dtype_size(s.copy_out_type) >= kStreamingBytes;
  cpu::for_chunks(s.count, kChunk, [&](size_t b, size_t e) {
    const Chunk at{s, b};
    table.lamb_apply(at.params(), at.m(), at.v(), at.out(), s.copy_out_type, e - b, c, lr_ratio, nt);
  });
}

StepReport cpu_optimizer_step(const OptimizerParams& params, const OptimizerStep& step, cpu::SimdLevel level) {
  optim::check_step(params, step);
  if (step.count == 0) return {};
  if (step.check_finite && cpu::has_nonfinite(step.grads, step.grad_type, step.count, level)) return {.skipped = true};
  if (params.kind == OptimizerKind::lamb) {
    float norms[2] = {0.0f, 0.0f};
    cpu_lamb_norms(params, step, norms, level);
    cpu_lamb_apply(params, step, norms, level);
    return {};
  }
  run(optim::kind_of(params), step, optim::make_constants(params, step), level);
  return {};
}

void cpu_optimizer_stream_ceiling(const OptimizerStep& step, cpu::SimdLevel level) {
  ZEROTH_CHECK(step.state[0] != nullptr && step.state[1] != nullptr, "the ceiling kernel streams two state arrays");
  StepConstants c{};
  c.grad_scale = step.grad_scale;
  run(Kind::ceiling, step, c, level);
}

size_t optimizer_bytes_per_param(OptimizerKind kind, DType grad_type, bool copy_out, DType copy_out_type) {
  OptimizerParams p;
  p.kind = kind;
  p.momentum = kind == OptimizerKind::sgd ? 0.9 : 0.0;
  // Lamb's second pass reads the params and both moments again.
  const size_t second_pass = kind == OptimizerKind::lamb ? 12 : 0;
  // params read + written, gradients read, each state array read + written, copy-out written
  return second_pass + 8 + dtype_size(grad_type) + 8 * static_cast<size_t>(p.state_arrays()) +
         (copy_out ? dtype_size(copy_out_type) : 0);
}

}  // namespace zeroth
