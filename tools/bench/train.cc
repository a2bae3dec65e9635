// `zeroth bench train`: training throughput (tokens/s) of a GPT on the CPU device (or, with
// --device cuda, on the GPU), next to the same model and step in PyTorch (tools/bench/
// train_torch.py: Debian's python3-torch on the CPU; on a GPU the machine's PyTorch under its bf16
// autocast with its SDPA attention) with the same shapes, threads and precision, in one run. Both
// sides skip a warm-up step and report the median step. OpenBLAS reads its environment at load
// time, so run the whole command under the environment you want both sides to see (see
// docs/PERFORMANCE.md).
#include <unistd.h>  // getpid

#include <algorithm>   // std::max
#include <cstdio>      // std::printf
#include <functional>  // std::function
#include <string>      // std::string
#include <thread>      // std::thread::hardware_concurrency
#include <vector>      // std::vector

#include <CLI/CLI.hpp>        // CLI::App
#include <fmt/format.h>       // fmt::format
#include <fmt/ranges.h>       // fmt::join
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/cuda/cuda_info.h"    // cuda_info
#include "core/stats.h"             // median
#include "comm/local/local_comm.h"  // run_local_ranks
#include "core/cpu/blas_info.h"     // blas_info
#include "core/cpu/gemm.h"          // gemm_library
#include "core/env.h"               // env::kGemm
#include "core/error.h"             // ZEROTH_THROW
#include "core/log.h"               // log::set_level
#include "core/memory.h"            // format_bytes
#include "train/trainer.h"          // train
#include "core/cpu/threads.h"       // share_cores
#include "tools/bench/bench.h"
#include "tools/cli/options.h"       // parse_count
#include "tools/launch/process.h"    // run_process
#include "tools/bench/step_gemms.h"  // step_gemms
#include "tools/bench/train_runs.h"  // TrainBenchOptions, run_zeroth

namespace zeroth::tools {
namespace bench_train {

using Options = TrainBenchOptions;

// A GPU's dense 16-bit (or f32) tensor-core peak from its data sheet, by name; 0 when not known.
double gpu_peak_flops(const std::string& name, bool bf16) {
  struct Known {
    const char* part;
    double bf16, f32;  // FLOP/s, dense; f32 as TF32 tensor-core rate
  };
  // H100 SXM and H200: 989 TFLOP/s bf16, 495 TF32 (dense); H100 PCIe 756 / 378; A100 312 / 156.
  static constexpr Known kKnown[] = {{"H200", 989.4e12, 494.7e12},
                                     {"H100 PCIe", 756.0e12, 378.0e12},
                                     {"H100", 989.4e12, 494.7e12},
                                     {"A100", 312.0e12, 156.0e12}};
  for (const auto& k : kKnown)
    if (name.find(k.part) != std::string::npos) return bf16 ? k.bf16 : k.f32;
  return 0;
}

nlohmann::json run_torch(const Options& o, const GptConfig& m, int threads) {
  std::vector<std::string> argv = {o.python, o.script, "--layers", std::to_string(m.n_layer), "--heads", std::to_string(m.n_head),
                                   "--embd", std::to_string(m.n_embd), "--vocab", std::to_string(m.vocab_size), "--seq",
                                   std::to_string(o.seq), "--batch", std::to_string(o.batch), "--steps", std::to_string(o.steps),
                                   "--threads", std::to_string(threads),
                                   // bf16: PyTorch's bf16 autocast, its products in bf16 on oneDNN (attention's
                                   // too, and their outputs rounded: not the same computation as zeroth's).
                                   "--autocast", o.dtype == "bf16" ? "1" : "0", "--device", o.device,
                                   // On a GPU, PyTorch's fused attention, as a user of it trains.
                                   "--sdpa", o.device == "cpu" ? "0" : "1"};
  if (m.llama()) {
    // The Llama family's switches the reference computes (no biases, no q/k norms: the presets'
    // SmolLM, Llama and TinyLlama shapes).
    if (m.qkv_bias || m.o_bias || m.qk_norm || m.rope_scaling.type != RopeScaling::Type::none) {
      ZEROTH_THROW(InvalidArgument,
                   "--preset {}: the PyTorch reference has no attention biases, q/k norms or rope scaling; add "
                   "--no-reference",
                   o.preset);
    }
    for (const std::string& a :
         {std::string("--kv-heads"), std::to_string(m.kv_heads()), std::string("--head-dim"), std::to_string(m.head_size()),
          std::string("--ffn"), std::to_string(m.ffn()), std::string("--tied"), std::string(m.tie_word_embeddings ? "1" : "0"),
          std::string("--theta"), fmt::format("{}", m.rope_theta)})
      argv.push_back(a);
  }
  ProcessResult torch;
  try {
    torch = run_process(argv);
  } catch (const IoError& e) {
    torch.status = 127;
    torch.err = e.what();
  }
  const std::string& out = torch.out;
  if (torch.status != 0) {
    ZEROTH_THROW(
        Error,
        "the PyTorch reference failed (status {}): {}{}\n  command: {}\n  (needs Debian's python3-torch; --no-reference skips it)",
        torch.status, out, torch.err, fmt::join(argv, " "));
  }
  return nlohmann::json::parse(out.substr(out.rfind('{')));
}

// The model FLOPs a token costs as the planner counts them (Narayanan et al. 2021: 72 l h^2 +
// 12 l s h + 6 V h for GPT-2: 6 per weight of the layers' matmuls and the head, 12 s per attention
// channel); the Llama family's layer weights: q, k, v (grouped), o, and SwiGLU's three matrices.
double model_flops_per_token(const GptConfig& m, int seq) {
  const double l = m.n_layer, h = m.n_embd, s = seq, v = m.vocab_size, q = static_cast<double>(m.n_head) * m.head_size();
  const double layer = m.llama() ? h * (q + 2.0 * m.kv_heads() * m.head_size()) + q * h + 3 * h * m.ffn() : 12 * h * h;
  return 6 * l * layer + 12 * l * s * q + 6 * v * h;
}

// Ulysses over o.sequence of the ranks (or ring attention over o.context) at o.seq positions, next
// to one rank a sample at the longest window the same device memory holds (the engine's estimate of
// the group's run), on the same ranks: tokens/s of both, and the exchanges' exposed share of the
// passes (Ulysses' all-to-alls run in turn on the compute stream: all of them; the ring's sends run
// on a stream of their own: what the compute stream waits for them).
void bench_sequence(const Options& o, const GptConfig& m, const std::function<void(const std::string&)>& say) {
  const int U = o.group();
  const bool ring = o.context > 1;
  const std::string flag = ring ? "--context" : "--sequence", name = ring ? "ring attention" : "Ulysses";
  const RunShape ulysses{.sequence = o.sequence, .context = o.context};
  const size_t budget = largest_stage(TrainConfig::from_json(run_config(o, m, ulysses))).need.total(Tier::device);
  const int window = std::min(o.seq, longest_window(o, m, {}, budget, 256));
  if (window == 0)
    ZEROTH_THROW(InvalidArgument, "{} {}: one rank a sample fits no window of 256 positions in {}", flag, U, format_bytes(budget));
  const StepTimes u = run_zeroth(o, m, ulysses);
  GptConfig one = m;
  one.seq_len = window;
  const StepTimes w = run_zeroth(o, one);
  const double tu = median(u.seconds), tw = median(w.seconds);
  const double tokens_u = static_cast<double>(o.batch) * o.seq * o.ranks / U,
               tokens_w = static_cast<double>(o.batch) * window * o.ranks;
  std::vector<double> share;
  for (size_t i = 1; i < u.exchange_seconds.size(); ++i) share.push_back(u.exchange_seconds[i] / u.pass_seconds[i]);
  const double exposed = median(share),
               exchange_s = median(std::vector<double>(u.exchange_seconds.begin() + 1, u.exchange_seconds.end()));
  say(fmt::format("  {:<30} median step {:7.3f} s   {:8.0f} tokens/s   peak {} (estimate {})\n",
                  fmt::format("{} over {} ranks, seq {}", name, U, o.seq), tu, tokens_u / tu, format_bytes(u.peak),
                  format_bytes(u.estimate)));
  say(fmt::format("  {:<30} {} {:.3f} s a step, {:.1f}% of the passes (median; {})\n", "",
                  ring ? "waits for the sends" : "all-to-alls", exchange_s, 100 * exposed,
                  ring ? "the sends run on a stream of their own: this is their exposed part"
                       : "in turn on the compute stream: all exposed"));
  say(fmt::format("  {:<30} median step {:7.3f} s   {:8.0f} tokens/s   peak {} (estimate {})\n",
                  fmt::format("one rank a sample, seq {}", window), tw, tokens_w / tw, format_bytes(w.peak),
                  format_bytes(w.estimate)));
  say(fmt::format("  the same device memory ({} a rank by the estimate): a {:.1f}x longer window under {} at {:.2f}x the tokens/s\n",
                  format_bytes(budget), static_cast<double>(o.seq) / window, name, (tokens_u / tu) / (tokens_w / tw)));
  if (o.json) {
    const nlohmann::json j = {
        {"preset", o.preset},
        {"ranks", o.ranks},
        {"sequence", o.sequence},
        {"context", o.context},
        {"seq", o.seq},
        {"batch", o.batch},
        {"budget_bytes", budget},
        {ring ? "ring" : "ulysses",
         {{"step_s", tu},
          {"tokens_per_s", tokens_u / tu},
          {"exchange_s", exchange_s},
          {"exchange_share", exposed},
          {"peak_bytes", u.peak},
          {"estimate_bytes", u.estimate}}},
        {"one_rank_a_sample",
         {{"seq", window}, {"step_s", tw}, {"tokens_per_s", tokens_w / tw}, {"peak_bytes", w.peak}, {"estimate_bytes", w.estimate}}}};
    std::printf("%s\n", j.dump(2).c_str());
  }
}

// Long: the benchmark's procedure (device and peak, zeroth's step, the chunked loss, the products alone, the experts or
// PyTorch, the JSON); the later rows are ratios to zeroth's step measured first.
void run(Options o) {
  if (o.sequence > 1 && o.context > 1)
    ZEROTH_THROW(InvalidArgument, "--sequence {} and --context {}: time one of Ulysses and ring attention at a time", o.sequence,
                 o.context);
  if (o.group() > 1 && o.ranks == 1) o.ranks = o.group();  // one Ulysses or ring group
  if (o.dtype != "fp32" && o.dtype != "bf16") ZEROTH_THROW(InvalidArgument, "--dtype must be fp32 or bf16, got {}", o.dtype);
  const bool gpu = o.device != "cpu";
  const bool indexed = o.device.starts_with("cuda:") && o.device.size() > 5 &&
                       o.device.find_first_not_of("0123456789", 5) == std::string::npos && o.device.size() < 9;
  if (gpu && o.device != "cuda" && !indexed) ZEROTH_THROW(InvalidArgument, "--device must be cpu, cuda or cuda:N, got {}", o.device);
  if (o.group() > 1 && (o.ranks % o.group() != 0 || o.experts > 0 || o.lora_r > 0 || gpu)) {
    ZEROTH_THROW(InvalidArgument,
                 "{} {} shares each sample over runs of that many of the --ranks ({}), on the CPU device, without --experts or "
                 "--lora-r: give --ranks a multiple of it",
                 o.context > 1 ? "--context" : "--sequence", o.group(), o.ranks);
  }
  if (gpu && (o.experts > 0 || o.loss_chunk > 0))
    ZEROTH_THROW(InvalidArgument, "--experts and --loss-chunk time the CPU device; leave them out with --device {}", o.device);
  // MFU on a GPU: the given peak, or its data sheet's.
  double peak = 0;
  std::string peak_how;
  if (gpu) {
    const CudaInfo info = cuda_info();
    const size_t index = indexed ? std::stoul(o.device.substr(5)) : 0;
    if (index >= info.gpus.size())
      ZEROTH_THROW(InvalidArgument, "--device {}: this machine has {} usable GPU(s){}", o.device, info.gpus.size(),
                   info.problem.empty() ? "" : " (" + info.problem + ")");
    const std::string name = info.gpus[index].name;
    peak = !o.peak_flops.empty() ? parse_count(o.peak_flops, "--peak-flops") : gpu_peak_flops(name, o.dtype == "bf16");
    peak_how = !o.peak_flops.empty() ? "--peak-flops"
               : peak > 0            ? fmt::format("{}'s data sheet, dense {}", name, o.dtype == "bf16" ? "bf16" : "TF32")
                                     : fmt::format("{}: no data-sheet peak known; give --peak-flops", name);
  }
  // With --json standard output is the JSON alone, for `zeroth plan --calibrate`.
  auto say = [&](const char* format, auto... args) {
    if (!o.json) std::printf(format, args...);
  };
  GptConfig m = o.model();
  if (o.ranks < 1) ZEROTH_THROW(InvalidArgument, "--ranks must be at least 1, got {}", o.ranks);
  if (o.link_gbps < 0 || o.link_latency_us < 0) {
    ZEROTH_THROW(InvalidArgument, "--link-gbps {} --link-latency-us {}: a link's bandwidth and latency cannot be negative",
                 o.link_gbps, o.link_latency_us);
  }
  const LinkModel link{o.link_latency_us, o.link_gbps, true};
  if (link.enabled() && (o.experts == 0 || o.expert_parallel < 2)) {
    ZEROTH_THROW(InvalidArgument,
                 "--link-gbps / --link-latency-us time the experts' all-to-alls: give --experts and --expert-parallel 2 or more too");
  }
  if (o.experts > 0 && (o.top_k < 1 || o.top_k > o.experts || m.ffn() % o.top_k != 0)) {
    ZEROTH_THROW(InvalidArgument, "--experts {} --top-k {}: top-k must be within 1 and the experts and divide the MLP's width ({})",
                 o.experts, o.top_k, m.ffn());
  }
  // Every core shared by the ranks (one rank: all of them), as zeroth train shares them.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = o.threads > 0 ? o.threads : std::max(1, cores / o.ranks);
  share_cores(std::max(1, cores / threads));
  log::set_level(log::Level::warn);
  const double tokens = static_cast<double>(o.batch) * o.seq * o.ranks / o.group();
  say("bench train: %s %s (%.2fM parameters), seq %d, batch %d x %d rank%s = %.0f tokens/step, %s, %s, %d timed steps after 1 "
      "warm-up\n",
      m.llama() ? "Llama-family" : "GPT", o.preset.c_str(), static_cast<double>(m.num_parameters()) / 1e6, o.seq, o.batch, o.ranks,
      o.ranks == 1 ? "" : "s", tokens, o.dtype.c_str(),
      gpu ? fmt::format("on {}, MFU against {:.0f} TFLOP/s ({})", o.device, peak / 1e12, peak_how).c_str()
          : fmt::format("{} thread{}", threads, threads == 1 ? "" : "s").c_str(),
      o.steps);
  const double flops_per_token = model_flops_per_token(m, o.seq);
  auto mfu = [&](double seconds) {
    return peak > 0 ? fmt::format("   MFU {:.1f}%", 100 * flops_per_token * tokens / seconds / peak) : std::string();
  };
  // The GEMM library and its kernels decide the matmul speed (2x or more between them): figures
  // compare only with figures taken on the same ones.
  if (!gpu)
    say("  gemm: %s (%s=%s)\n", cpu::gemm_library_summary(cpu::gemm_library()).c_str(), std::string(env::kGemm).c_str(),
        std::string(cpu::gemm_library_name(cpu::gemm_library())).c_str());
  const cpu::BlasInfo blas = cpu::blas_info();
  if (!gpu && cpu::gemm_library() == cpu::GemmLibrary::openblas) {
    say("  blas: %s\n", blas.summary().c_str());
    if (blas.below_cpu()) say("  blas: below this CPU's kernels; `zeroth report` says why and what changing it risks\n");
  }
  std::fflush(stdout);
  if (o.loss_chunk > 0 && o.group() > 1) m.loss_chunk_rows = o.loss_chunk;
  if (o.tiled_mlp > 0 && o.group() > 1) m.mlp_tile_rows = o.tiled_mlp;
  if (o.group() > 1) return bench_sequence(o, m, [&](const std::string& line) { say("%s", line.c_str()); });
  const StepTimes full = run_zeroth(o, m);
  const double z = median(full.seconds);
  say("  %-22s median step %7.3f s   %8.0f tokens/s%s\n",
      fmt::format("zeroth (stage {}{})", o.stage, o.offload == "none" ? "" : ", offload " + o.offload).c_str(), z, tokens / z,
      mfu(z).c_str());
  std::fflush(stdout);
  // A variant of the model beside the step above: what it saves of the activations Gpt plans (one
  // rank, one micro-batch) and what it costs.
  auto variant = [&](const std::string& label, const GptConfig& v) {
    const double t = median(run_zeroth(o, v).seconds);
    const double whole_mib = static_cast<double>(Gpt::activation_bytes(m, o.batch, o.seq)) / (1 << 20);
    const double mib = static_cast<double>(Gpt::activation_bytes(v, o.batch, o.seq)) / (1 << 20);
    say("  %-22s median step %7.3f s   %8.0f tokens/s  (%.3fx the step; activations %.0f MiB against %.0f MiB)\n", label.c_str(), t,
        tokens / t, t / z, mib, whole_mib);
    std::fflush(stdout);
  };
  if (o.loss_chunk > 0) {  // each chunk's logits made again in the backward
    GptConfig chunked = m;
    chunked.loss_chunk_rows = o.loss_chunk;
    variant(fmt::format("loss by {} tokens", o.loss_chunk), chunked);
  }
  if (o.tiled_mlp > 0) {  // each tile's MLP intermediates made again in the backward
    GptConfig tiled = m;
    tiled.mlp_tile_rows = o.tiled_mlp;
    variant(fmt::format("MLP by {} rows", o.tiled_mlp), tiled);
  }
  // The ceiling: the step's own products timed alone, one rank's worth on the same threads.
  double gemm_s = 0, gemm_flops = 0;
  if (!gpu && o.ranks == 1 && o.experts == 0) {
    std::vector<StepGemm> gemms = step_gemms(m, o.batch, o.seq, o.dtype == "bf16");
    time_step_gemms(gemms, 3);
    for (const StepGemm& g : gemms) {
      gemm_s += static_cast<double>(g.count) * g.seconds;
      gemm_flops += static_cast<double>(g.count) * 2.0 * static_cast<double>(g.m * g.n * g.k);
    }
    say("  %-22s %7.3f s   %8.0f GFLOP at %.0f GFLOP/s alone; the step runs at %.2f of that rate\n", "the step's products", gemm_s,
        gemm_flops / 1e9, gemm_flops / gemm_s / 1e9, gemm_s / z);
  }
  if (o.experts > 0) {
    // The same tokens through experts: routing, all-to-alls, small products, the combine.
    const double e = median(run_zeroth(o, m, {.moe = true}).seconds);
    say("  %-22s median step %7.3f s   %8.0f tokens/s\n", fmt::format("{} experts, top {}", o.experts, o.top_k).c_str(), e,
        tokens / e);
    say("  mixture of experts / dense: %.2fx the step (%d rank%s, experts over %d, %s, experts %d wide)\n", e / z, o.ranks,
        o.ranks == 1 ? "" : "s", o.expert_parallel,
        o.capacity_factor > 0 ? fmt::format("capacity factor {}", o.capacity_factor).c_str() : "dropless", m.ffn() / o.top_k);
    if (link.enabled()) {
      // Under the link: the exchanges in turn cost their whole time; overlapped, what the products
      // do not cover. The free exchange above is the floor neither can go below.
      std::fflush(stdout);
      const double serial = median(run_zeroth(o, m, {.moe = true, .overlap = false, .link = link}).seconds);
      const double overlapped = median(run_zeroth(o, m, {.moe = true, .overlap = true, .link = link}).seconds);
      say("  link model %.3g GB/s, %.0f us: all-to-alls in turn  median step %7.3f s\n", link.bandwidth_gbps, link.latency_us, serial);
      say("  link model %.3g GB/s, %.0f us: all-to-alls overlapped median step %7.3f s\n", link.bandwidth_gbps, link.latency_us,
          overlapped);
      say("  exchange time exposed: in turn %.3f s, overlapped %.3f s (%.0f%% of it hidden); overlapped / free %.2fx\n", serial - e,
          overlapped - e, serial > e ? 100.0 * (serial - overlapped) / (serial - e) : 0.0, overlapped / e);
    }
    return;
  }
  nlohmann::json lora_json;
  if (o.lora_r > 0) {
    // The same layout with LoRA: the base frozen (no gradients, reduction or optimizer state), the
    // adapters' products added to every linear layer.
    const StepTimes lora = run_zeroth(o, m, {.lora_r = o.lora_r});
    const double l = median(lora.seconds);
    const double mib = 1 << 20;
    auto d = [](size_t a, size_t b) { return static_cast<double>(a) - static_cast<double>(b); };
    const double saved = d(full.peak, lora.peak), predicted = d(full.estimate, lora.estimate);
    say("  %-22s median step %7.3f s   %8.0f tokens/s  (%.2fx the full fine-tune's speed)\n",
        fmt::format("LoRA r {}, {}", o.lora_r, fmt::join(o.lora_targets, ", ")).c_str(), l, tokens / l, z / l);
    say("  peak device memory: full fine-tune %.2f MiB (estimate %.2f), LoRA %.2f MiB (estimate %.2f); LoRA saves %.2f MiB, "
        "the estimate says %.2f (%.1f%% off)\n",
        static_cast<double>(full.peak) / mib, static_cast<double>(full.estimate) / mib, static_cast<double>(lora.peak) / mib,
        static_cast<double>(lora.estimate) / mib, saved / mib, predicted / mib,
        saved != 0 ? 100.0 * (predicted - saved) / saved : 0.0);
    lora_json = {{"r", o.lora_r},
                 {"step_s", l},
                 {"speedup", z / l},
                 {"peak_bytes", lora.peak},
                 {"estimate_bytes", lora.estimate},
                 {"full_peak_bytes", full.peak},
                 {"full_estimate_bytes", full.estimate}};
    std::fflush(stdout);
  }
  // PyTorch beside it, on one rank.
  nlohmann::json torch;
  double r = 0;
  if (o.reference && o.ranks == 1) {
    try {
      torch = run_torch(o, m, threads);
    } catch (const Error& e) {
      // zeroth's own figures stand without it: the JSON says why the reference is missing.
      if (!o.json) throw;
      torch = {{"error", e.what()}};
    }
  }
  if (torch.contains("step_s")) {
    r = median(torch["step_s"].get<std::vector<double>>());
    say("  %-22s median step %7.3f s   %8.0f tokens/s%s\n",
        fmt::format("pytorch {}{}{}", torch["torch"].get<std::string>(), o.dtype == "bf16" ? " bf16 autocast" : "",
                    gpu ? ", SDPA" : "")
            .c_str(),
        r, tokens / r, mfu(r).c_str());
    say("  zeroth / pytorch: %.2fx tokens/s\n", r / z);
  }
  if (o.json) {
    // What `zeroth plan --calibrate` reads: the model FLOPs per token as the planner counts them, so
    // tokens/s times it is the achieved rate; and PyTorch's side where it ran.
    nlohmann::json j = {{"preset", o.preset},         {"seq", o.seq},
                        {"batch", o.batch},           {"dtype", o.dtype},
                        {"threads", threads},         {"device", o.device},
                        {"stage", o.stage},           {"step_s", z},
                        {"gemm_alone_s", gemm_s},     {"gemm_flops", gemm_flops},
                        {"tokens_per_s", tokens / z}, {"model_flops_per_token", flops_per_token}};
    if (peak > 0) j["peak_flops"] = peak, j["mfu"] = flops_per_token * tokens / z / peak;
    if (!lora_json.is_null()) j["lora"] = lora_json;
    if (torch.contains("error")) j["torch"] = torch;
    if (r > 0) {
      j["torch"] = {{"version", torch["torch"]}, {"step_s", r}, {"tokens_per_s", tokens / r}};
      if (peak > 0) j["torch"]["mfu"] = flops_per_token * tokens / r / peak;
    }
    std::printf("%s\n", j.dump(2).c_str());
  }
}

}  // namespace bench_train

void add_bench_train_command(CLI::App& bench) {
  using namespace bench_train;
  auto o = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("train", "GPT or Llama-family training tokens/s on the CPU (or a GPU), next to PyTorch");
  cmd->add_option("--preset", o->preset,
                  "Model shape: gpt2-124m, gpt2-350m, ..., or the Llama family's: smollm-135m, llama-3.2-1b, ...");
  cmd->add_option("--seq", o->seq, "Sequence length");
  cmd->add_option("--batch", o->batch, "Sequences per step");
  cmd->add_option("--steps", o->steps, "Timed steps (after one warm-up step)");
  cmd->add_option("--threads", o->threads, "Threads for both sides, each rank's (default: the cores over the ranks)");
  cmd->add_option("--dtype", o->dtype, "fp32 or bf16 (PyTorch under bf16 autocast)");
  cmd->add_option("--stage", o->stage, "ZeRO stage (one rank)");
  cmd->add_option("--experts", o->experts,
                  "Also time the model with this many experts per MLP (each ffn / top-k wide: the same FLOPs per token), next to the "
                  "dense one, instead of PyTorch");
  cmd->add_option("--top-k", o->top_k, "Experts per token (with --experts)");
  cmd->add_option("--capacity-factor", o->capacity_factor, "Each expert's capacity factor (with --experts; 0: dropless)");
  cmd->add_option("--ranks", o->ranks, "Local ranks (data parallel; --batch sequences each)");
  cmd->add_option("--expert-parallel", o->expert_parallel, "Ranks the experts are shared out over (with --experts)");
  cmd->add_option("--link-gbps", o->link_gbps,
                  "With --expert-parallel: also time the experts with their all-to-alls held to a modeled link of this bandwidth (the "
                  "other collectives stay memcpy), in turn and overlapped with the experts' products");
  cmd->add_option("--link-latency-us", o->link_latency_us, "The modeled link's latency per all-to-all (with --link-gbps)");
  cmd->add_flag("!--no-reference", o->reference, "Skip the PyTorch side");
  cmd->add_flag("--json", o->json,
                "Print JSON: tokens/s and model FLOPs per token (what zeroth plan --calibrate reads), PyTorch's beside them unless "
                "--no-reference");
  cmd->add_option("--offload", o->offload, "offload_optimizer.device for zeroth's runs: none (default) or cpu (pinned host memory)")
      ->check(CLI::IsMember({"none", "cpu"}));
  cmd->add_option("--lora-r", o->lora_r,
                  "Also time LoRA of this rank on --lora-targets (alpha 2 r, the base frozen) on the same layout, with both runs' "
                  "peak device memory against the estimate");
  cmd->add_option("--lora-targets", o->lora_targets, "With --lora-r: the adapted modules (lora.target_modules; default all-linear)");
  cmd->add_option("--loss-chunk", o->loss_chunk,
                  "Also time the step with the LM head and loss by chunks of this many tokens (model.chunked_loss), next to the "
                  "whole logits");
  cmd->add_option("--tiled-mlp", o->tiled_mlp,
                  "Also time the step with each layer's MLP by tiles of this many rows (model.tiled_mlp), next to the whole MLP");
  cmd->add_option("--sequence", o->sequence,
                  "Ulysses over this many of --ranks (default: as many ranks) at --seq (with --tiled-mlp and --loss-chunk applied), "
                  "next to one rank a sample "
                  "at the longest window the same device memory holds, with the exchanges' share of the passes");
  cmd->add_option("--context", o->context,
                  "Ring attention over this many of --ranks (parallel.context), timed as --sequence is, with the exposed share of "
                  "the ring's sends");
  cmd->add_option("--layers", o->layers, "The preset's layers changed to this many");
  cmd->add_option("--hidden", o->hidden, "The preset's width changed (heads of hidden / heads channels)");
  cmd->add_option("--heads", o->heads, "The preset's attention heads changed");
  cmd->add_option("--kv-heads", o->kv_heads, "The preset's key/value heads changed (the Llama family's)");
  cmd->add_option("--ffn", o->ffn, "The preset's MLP width changed (the Llama family's)");
  cmd->add_option("--vocab", o->vocab, "The preset's vocabulary changed (synthetic tokens below it)");
  cmd->add_flag("--checkpointing", o->checkpointing, "Activation checkpointing (each layer recomputed in its backward)");
  cmd->add_flag("--host-checkpoints", o->host_checkpoints, "Activation checkpointing with the checkpoints in host memory");
  cmd->add_option("--python", o->python, "Interpreter with torch");
  cmd->add_option("--script", o->script, "The PyTorch side's script (default: the checkout's tools/bench/train_torch.py)");
  cmd->add_option("--device", o->device, "cpu (default), or cuda: both sides on the GPU (PyTorch with its SDPA attention)");
  cmd->add_option("--peak-flops", o->peak_flops,
                  "With --device cuda: the GPU's peak for MFU (default: the data sheet's for H100, H200, A100)");
  cmd->callback([o] { run(*o); });
}

}  // namespace zeroth::tools
