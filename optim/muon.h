// Muon (Jordan et al. 2024, "Muon: an optimizer for hidden layers"): momentum orthogonalised by a
// Newton-Schulz iteration, for one whole 2-D weight matrix. Written from Keller Jordan's reference
// (KellerJordan/Muon, muon.py), which DeepSpeed's Muon follows:
//   m = beta m + (1 - beta) g                         (the momentum buffer, lerp form)
//   u = nesterov ? (1 - beta) g + beta m : m
//   X = u / (||u||_F + 1e-7), transposed when the matrix has more rows than columns, then
//   ns_steps times: A = X X^T, B = b A + c A A, X = a X + B X  with (a, b, c) = (3.4445, -4.7750, 2.0315)
//   w = w (1 - lr wd) - lr scale X,   scale = sqrt(max(1, rows / cols))   (Keller's), or
//                                     0.2 sqrt(max(rows, cols))          (Moonlight's: matches AdamW's RMS)
// The iteration runs in f32 through the CPU's GEMM library (the reference runs it in bf16 on GPUs;
// f32 is the more exact of the two). The rows and columns are the matrix as torch.nn.Linear holds it
// ([out, in]): the scale's orientation.
#pragma once

#include <cstddef>  // size_t
#include <cstdint>  // int64_t

namespace zeroth {

enum class MuonScale : uint8_t { keller, match_adamw_rms };

struct MuonParams {
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  double weight_decay = 0.0;  // decoupled, with the unscaled lr
  MuonScale scale = MuonScale::keller;
};

struct MuonStep {
  float* param = nullptr;       // [rows, cols], row-major, updated in place
  const float* grad = nullptr;  // [rows, cols]
  float* momentum = nullptr;    // [rows, cols], the momentum buffer (zeros before the first step)
  int64_t rows = 0, cols = 0;
  double lr = 0.02;
  float grad_scale = 1.0f;  // the gradient is multiplied by this first (unscaling, clipping)
};

// Floats of scratch cpu_muon_step needs for a [rows, cols] matrix: the iterate twice and the two
// square products of its shorter side.
size_t muon_scratch_floats(int64_t rows, int64_t cols);

// X [n, m] (n <= m after the transposition) replaced by the Newton-Schulz iterate of `steps` steps
// from the normalised u [rows, cols]; written to `out` [rows, cols] in u's orientation. scratch:
// muon_scratch_floats(rows, cols).
void newton_schulz(const float* u, float* out, int64_t rows, int64_t cols, int steps, float* scratch);

// One Muon step of one matrix on the CPU. InvalidArgument for a non-matrix or missing pointers.
void cpu_muon_step(const MuonParams& params, const MuonStep& step, float* scratch);

// The update's scale for a [rows, cols] matrix.
double muon_update_scale(MuonScale scale, int64_t rows, int64_t cols);

}  // namespace zeroth
