#include "tools/bench/step_gemms.h"

#include <algorithm>  // std::max
#include <vector>     // std::vector

#include "core/cpu/gemm.h"     // sgemm, gemm_bf16
#include "core/cpu/kernels.h"  // cpu_features, active_simd_level
#include "core/stats.h"        // median_seconds

namespace zeroth::tools {

std::vector<StepGemm> step_gemms(const GptConfig& m, int batch, int seq, bool bf16) {
  const int64_t N = static_cast<int64_t>(batch) * seq, C = m.n_embd, L = m.n_layer, hs = m.head_size();
  const int64_t NH = m.n_head, KVH = m.kv_heads(), T = seq, heads = static_cast<int64_t>(batch) * NH;
  const bool on_bf16 = bf16 && cpu::gemm_bf16_native();
  std::vector<StepGemm> out;
  // A linear layer in -> out: forward x W^T, input gradient dy W, weight gradient dy^T x.
  auto linear = [&](const std::string& what, int64_t in, int64_t width, int64_t count) {
    out.push_back({what + " forward", false, true, N, width, in, count, on_bf16});
    out.push_back({what + " input gradient", false, false, N, in, width, count, on_bf16});
    out.push_back({what + " weight gradient", true, false, width, in, N, count, on_bf16});
  };
  linear("qkv", C, (NH + 2 * KVH) * hs, L);
  linear("attention output", NH * hs, C, L);
  if (m.llama()) {
    linear("gate and up", C, 2 * static_cast<int64_t>(m.ffn()), L);
    linear("down", m.ffn(), C, L);
  } else {
    linear("mlp up", C, m.ffn(), L);
    linear("mlp down", m.ffn(), C, L);
  }
  // Attention per sequence and head (scores, weighted values; their four gradients): the causal
  // half of each T x T product, which the model needs (the blocked attention computes a little
  // more, its diagonal blocks whole, and recomputes the scores in backward), timed as a T x T/2
  // product of the same FLOPs; bf16 where a bf16 run's attention has vdpbf16ps (AVX512-BF16).
  const int64_t per = heads * L, half = std::max<int64_t>(1, T / 2);
  const bool attention_bf16 = bf16 && cpu::cpu_features().avx512_bf16 && cpu::active_simd_level() == cpu::SimdLevel::avx512;
  out.push_back({"attention scores q k^T", false, true, T, half, hs, per, attention_bf16});
  out.push_back({"attention a v", false, false, T, hs, half, per, attention_bf16});
  out.push_back({"attention d(a) = dy v^T", false, true, T, half, hs, per, attention_bf16});
  out.push_back({"attention dv = a^T dy", true, false, half, hs, T, per, attention_bf16});
  out.push_back({"attention dq = dS k", false, false, T, hs, half, per, attention_bf16});
  out.push_back({"attention dk = dS^T q", true, false, half, hs, T, per, attention_bf16});
  linear("LM head", C, m.vocab_size, 1);
  return out;
}

void time_step_gemms(std::vector<StepGemm>& gemms, int reps) {
  for (StepGemm& g : gemms) {
    const int64_t a_size = g.m * g.k, b_size = g.k * g.n, c_size = g.m * g.n;
    const int64_t lda = g.trans_a ? g.m : g.k, ldb = g.trans_b ? g.k : g.n;
    std::vector<float> a(a_size, 0.01f), b(b_size, 0.02f), c(c_size, 0.0f);
    std::vector<uint16_t> a16(g.bf16 ? a_size : 0, 0x3c23), b16(g.bf16 ? b_size : 0, 0x3ca3);
    auto call = [&] {
      if (g.bf16) cpu::gemm_bf16(g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f, a16.data(), lda, b16.data(), ldb, 0.0f, c.data(), g.n);
      else cpu::sgemm(g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), g.n);
    };
    g.seconds = median_seconds(reps, call);
  }
}

}  // namespace zeroth::tools
