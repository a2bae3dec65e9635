// The matrix products of one training step of a GPT or Llama-family model on the CPU, by shape,
// timed alone with the library and threads the step uses: the ceiling `zeroth bench train` holds
// the step against (the products are most of its FLOPs; the rest is element-wise passes and the
// optimizer).
#pragma once

#include <cstdint>  // int64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include "models/decoder/gpt.h"  // GptConfig

namespace zeroth::tools {

struct StepGemm {
  std::string what;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t count = 0;   // calls of this shape per step
  bool bf16 = false;   // on gemm_bf16 (a bf16 run's products where they run on bf16 kernels)
  double seconds = 0;  // one call, timed alone (median of its repetitions)
};

// The products of forward and backward for `batch` sequences of `seq` tokens, as the CPU kernels
// call them (models/kernels/cpu/row_kernels.cc, attention.cc): per layer the linear layers (forward,
// input and weight gradients) and attention's per-head products, then the LM head. `bf16`: the run's
// parameters are bf16.
std::vector<StepGemm> step_gemms(const GptConfig& m, int batch, int seq, bool bf16);

// Times each shape alone (one untimed call, then the median of `reps`) with gemm_threads().
void time_step_gemms(std::vector<StepGemm>& gemms, int reps);

}  // namespace zeroth::tools
