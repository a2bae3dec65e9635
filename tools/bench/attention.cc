// `zeroth bench attention`: the CPU's blocked causal attention, forward and backward, as GFLOP/s of
// the model's own products next to the GEMM library's rate on one square product of the same
// FLOPs, with the same threads, in the same run: the ceiling a kernel made of products can reach.
// --dtype bf16 times a bf16 run's attention (bf16 products) against the library's bf16 GEMM.
#include <algorithm>  // std::clamp, std::max
#include <chrono>     // std::chrono::steady_clock
#include <cmath>      // std::cbrt, std::sin
#include <cstdio>     // std::printf
#include <memory>     // std::make_shared
#include <string>     // std::string
#include <vector>     // std::vector

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/cpu/cpu_device.h"  // CpuDevice
#include "core/cpu/gemm.h"        // measure_gemm, gemm_library_summary
#include "core/cpu/kernels.h"     // cpu::num_threads
#include "core/error.h"           // ZEROTH_CHECK
#include "core/stats.h"           // median_seconds
#include "models/kernels/cpu/row_kernels.h"
#include "core/cpu/threads.h"  // share_cores
#include "tools/bench/bench.h"

namespace zeroth::tools {
namespace bench_attention {

struct Options {
  int batch = 4, heads = 12, kv_heads = 0, head_size = 64, threads = 0, reps = 5;
  int samples = 1;  // > 1: each sequence a packed row of this many samples (data.packing)
  std::vector<int> seq = {256, 512, 1024, 2048};
  bool json = false;
  std::string dtype = "fp32";
};

struct Row {
  int T = 0;
  double fwd_flops = 0, fwd_s = 0, bwd_s = 0, fwd_gflops = 0, bwd_gflops = 0, gemm_fwd_gflops = 0, gemm_bwd_gflops = 0;
  double packed_fwd_s = 0, packed_bwd_s = 0;  // --samples: the row's samples each attending within itself
};

// The square product whose 2 n^3 FLOPs are closest to `flops`, n a multiple of 64 in [64, 8192]:
// sizes with a large odd factor block poorly (oneDNN's sgemm at n = 1168 = 16 x 73 ran at 0.65 of
// its rate at 1152 here), which would flatter the kernel measured against it.
int square_of(double flops) { return std::clamp(static_cast<int>(std::cbrt(flops / 2) / 64 + 0.5) * 64, 64, 8192); }

// The best of three medians of the library's sgemm (or bf16 GEMM) on an n x n x n product: the
// ceiling is what the library can reach, and one median taken on a busy machine (or while another
// pool's threads still spin after the attention) can fall to half of it.
double best_gemm_gflops(int n, int reps, bool bf16) {
  double best = 0;
  for (int i = 0; i < 3; ++i) best = std::max(best, cpu::measure_gemm(n, reps, cpu::gemm_library(), bf16).gflops);
  return best;
}

// Long: the benchmark top to bottom (per sequence length the tensors, the warm-up, the timed passes and the GEMM ceilings,
// then the JSON or the table); each step uses the one before.
void run(const Options& o) {
  const int KVH = o.kv_heads > 0 ? o.kv_heads : o.heads;
  ZEROTH_CHECK(o.batch >= 1 && o.heads >= 1 && o.head_size >= 1 && o.reps >= 1,
               "--batch, --heads, --head-size and --reps must be positive");
  ZEROTH_CHECK(o.heads % KVH == 0, "--kv-heads ({}) must divide --heads ({})", KVH, o.heads);
  ZEROTH_CHECK(o.dtype == "fp32" || o.dtype == "bf16", "--dtype must be fp32 or bf16, got {}", o.dtype);
  const bool bf16 = o.dtype == "bf16";
  const DType products = bf16 ? DType::bf16 : DType::f32;
  const int threads = o.threads > 0 ? o.threads : cpu::num_threads();
  share_cores(1);
  cpu::set_num_threads(threads);
  cpu::set_gemm_threads(threads);
  const int B = o.batch, NH = o.heads, hs = o.head_size;
  const size_t W = static_cast<size_t>(NH + 2 * KVH) * hs, Cq = static_cast<size_t>(NH) * hs;
  CpuDevice device;
  std::vector<Row> rows;
  for (const int T : o.seq) {
    ZEROTH_CHECK(T >= 1, "--seq lengths must be positive, got {}", T);
    const size_t BT = static_cast<size_t>(B) * T;
    // The tensors live where a model's do, on the CPU device (2 MiB pages where the kernel has
    // them): with 4 KiB pages the rows a block copies, W floats apart, cost TLB misses training
    // does not pay (7% of the forward at seq 512). Each is written before it is read.
    auto floats = [&device](size_t n) { return device.allocate(n * sizeof(float), MemTag::activations); };
    const Buffer qkv_buffer = floats(BT * W), out_buffer = floats(BT * Cq), dout_buffer = floats(BT * Cq),
                 dqkv_buffer = floats(BT * W), lse_buffer = floats(static_cast<size_t>(B) * NH * T);
    float *qkv = qkv_buffer.as<float>(), *out = out_buffer.as<float>(), *dout = dout_buffer.as<float>(),
          *dqkv = dqkv_buffer.as<float>(), *lse = lse_buffer.as<float>();
    for (size_t i = 0; i < BT * W; ++i) qkv[i] = std::sin(0.37f * static_cast<float>(i % 10007));
    for (size_t i = 0; i < BT * Cq; ++i) dout[i] = std::sin(0.11f * static_cast<float>(i % 9973)) * 1e-2f;
    // The model's FLOPs: the scores and the weighted sum over the keys each row may see (T (T + 1)
    // / 2 pairs a head), and twice that backward (its four products; recomputing the scores is the
    // kernel's own cost, not the model's).
    const double fwd_flops = 2.0 * 2.0 * B * NH * hs * (static_cast<double>(T) * (T + 1) / 2), bwd_flops = 2 * fwd_flops;
    Row r;
    r.T = T, r.fwd_flops = fwd_flops;
    if (rows.empty()) {
      // oneTBB wakes its workers on first use: for about 0.1 s after start the first row ran at one
      // thread's rate. Run the kernel for 0.3 s before timing anything.
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
      while (std::chrono::steady_clock::now() < until) gpt::cpu::attention_forward(out, lse, qkv, B, T, NH, KVH, hs, products);
    }
    r.fwd_s = median_seconds(o.reps, [&] { gpt::cpu::attention_forward(out, lse, qkv, B, T, NH, KVH, hs, products); });
    r.bwd_s = median_seconds(o.reps, [&] { gpt::cpu::attention_backward(dqkv, dout, out, qkv, lse, B, T, NH, KVH, hs, products); });
    r.fwd_gflops = fwd_flops / r.fwd_s / 1e9, r.bwd_gflops = bwd_flops / r.bwd_s / 1e9;
    if (o.samples > 1) {
      // A packed row: samples of T / samples rows, each its own causal attention from its first row
      // (what Gpt::forward runs for positions that restart), against the whole row's above.
      ZEROTH_CHECK(T % o.samples == 0, "--samples {} must divide --seq {}", o.samples, T);
      const int n = T / o.samples;
      auto each = [&](auto&& f) {
        for (int b = 0; b < B; ++b)
          for (int k = 0; k < o.samples; ++k) f(static_cast<size_t>(b) * T + static_cast<size_t>(k) * n);
      };
      r.packed_fwd_s = median_seconds(o.reps, [&] {
        each([&](size_t row) {
          gpt::cpu::attention_forward(out + row * Cq, lse + row * NH, qkv + row * W, 1, n, NH, KVH, hs, products);
        });
      });
      r.packed_bwd_s = median_seconds(o.reps, [&] {
        each([&](size_t row) {
          gpt::cpu::attention_backward(dqkv + row * W, dout + row * Cq, out + row * Cq, qkv + row * W, lse + row * NH, 1, n, NH, KVH,
                                       hs, products);
        });
      });
    }
    r.gemm_fwd_gflops = best_gemm_gflops(square_of(fwd_flops), o.reps, bf16);
    r.gemm_bwd_gflops = best_gemm_gflops(square_of(bwd_flops), o.reps, bf16);
    rows.push_back(r);
  }
  const std::string library = cpu::gemm_library_summary(cpu::gemm_library());
  if (o.json) {
    nlohmann::json j;
    j["gemm"] = library, j["dtype"] = o.dtype, j["threads"] = threads, j["batch"] = B, j["heads"] = NH, j["kv_heads"] = KVH,
    j["head_size"] = hs;
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows) {
      j["rows"].push_back({{"seq", r.T},
                           {"forward_flops", r.fwd_flops},
                           {"backward_flops", 2 * r.fwd_flops},
                           {"forward_ms", r.fwd_s * 1e3},
                           {"backward_ms", r.bwd_s * 1e3},
                           {"forward_gflops", r.fwd_gflops},
                           {"backward_gflops", r.bwd_gflops},
                           {"gemm_forward_gflops", r.gemm_fwd_gflops},
                           {"gemm_backward_gflops", r.gemm_bwd_gflops},
                           {"forward_of_gemm", r.fwd_gflops / r.gemm_fwd_gflops},
                           {"backward_of_gemm", r.bwd_gflops / r.gemm_bwd_gflops},
                           {"packed_forward_ms", r.packed_fwd_s * 1e3},
                           {"packed_backward_ms", r.packed_bwd_s * 1e3}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("zeroth bench attention: causal, %s, batch %d, %d query heads over %d, head size %d, %d thread(s), %s; median of %d\n",
              o.dtype.c_str(), B, NH, KVH, hs, threads, library.c_str(), o.reps);
  std::printf("%6s %11s %9s %9s %8s %12s %9s %9s %8s\n", "seq", "forward ms", "GFLOP/s", "GEMM's", "of GEMM", "backward ms", "GFLOP/s",
              "GEMM's", "of GEMM");
  for (const Row& r : rows) {
    std::printf("%6d %11.2f %9.1f %9.1f %8.2f %12.2f %9.1f %9.1f %8.2f\n", r.T, r.fwd_s * 1e3, r.fwd_gflops, r.gemm_fwd_gflops,
                r.fwd_gflops / r.gemm_fwd_gflops, r.bwd_s * 1e3, r.bwd_gflops, r.gemm_bwd_gflops, r.bwd_gflops / r.gemm_bwd_gflops);
  }
  std::printf(
      "(FLOPs are the model's: the causal half of the scores and weighted sums, twice that backward; GEMM's: the library's %s on "
      "the square product of the same FLOPs, same threads)\n",
      bf16 ? "bf16 GEMM" : "sgemm");
  if (o.samples <= 1) return;
  std::printf("\npacked rows of %d samples each, every sample attending within itself (data.packing), against the whole row:\n",
              o.samples);
  std::printf("%6s %15s %16s %11s %16s %17s %11s\n", "seq", "row forward ms", "packed forward", "faster by", "row backward ms",
              "packed backward", "faster by");
  for (const Row& r : rows) {
    std::printf("%6d %15.2f %16.2f %10.2fx %16.2f %17.2f %10.2fx\n", r.T, r.fwd_s * 1e3, r.packed_fwd_s * 1e3,
                r.fwd_s / r.packed_fwd_s, r.bwd_s * 1e3, r.packed_bwd_s * 1e3, r.bwd_s / r.packed_bwd_s);
  }
  std::printf("(the causal pairs of a row of %d samples are about 1 / %d of the whole row's: the ceiling of the speed-up)\n",
              o.samples, o.samples);
}

}  // namespace bench_attention

void add_bench_attention_command(CLI::App& bench) {
  using namespace bench_attention;
  auto options = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("attention", "GFLOP/s of the CPU's blocked causal attention next to the GEMM library's");
  cmd->add_option("--batch", options->batch, "Sequences (default 4)");
  cmd->add_option("--heads", options->heads, "Query heads (default 12)");
  cmd->add_option("--kv-heads", options->kv_heads, "Key/value heads (default: as many as query heads)");
  cmd->add_option("--head-size", options->head_size, "Channels per head (default 64)");
  cmd->add_option("--seq", options->seq, "Sequence lengths (default 256 512 1024 2048)")->delimiter(',');
  cmd->add_option("--threads", options->threads, "Threads (default: all)");
  cmd->add_option("--samples", options->samples,
                  "Also time each sequence as a packed row of this many equal samples, each attending within itself (default 1: no)");
  cmd->add_option("--reps", options->reps, "Timed repetitions; the median is reported (default 5)");
  cmd->add_option("--dtype", options->dtype, "fp32, or bf16: a bf16 run's attention, against the library's bf16 GEMM (default fp32)");
  cmd->add_flag("--json", options->json, "Print JSON");
  cmd->callback([options] { run(*options); });
}

}  // namespace zeroth::tools
