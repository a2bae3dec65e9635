// `zeroth bench optim`: the CPU optimizer steps (AdamW, and Lamb's two passes) in params/s and
// GB/s (bytes the step must move), next to a ceiling kernel that streams AdamW's arrays in the
// same pattern with trivial arithmetic, and next to PyTorch's AdamW (foreach) when Debian's
// python3-torch is installed.
#include <tbb/global_control.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/stats.h"  // median
#include "core/cpu/kernels.h"
#include "core/device.h"
#include "core/error.h"
#include "core/cpu/gemm.h"  // cpu::sgemm
#include "optim/muon.h"
#include "optim/optimizer.h"
#include "tools/bench/bench.h"
#include "tools/launch/process.h"  // run_process

namespace zeroth::tools {
namespace bench_optim {

using clock = std::chrono::steady_clock;

struct Options {
  std::string device = "cpu";
  std::vector<std::string> params = {"1e6", "1e7", "1e8"};
  std::vector<int> threads;  // default: 1 and all
  int reps = 7;
  bool torch = true;
  bool json = false;
  std::vector<std::string> muon = {"1024x1024", "1024x4096", "4096x1024"};  // Muon's matrices, ROWSxCOLS
};


struct Row {
  std::string optimizer;
  size_t params = 0;
  int threads = 0;
  std::string grad_dtype;
  bool copy_out = false;
  double seconds = 0, ceiling_seconds = 0;
  size_t bytes_per_param = 0, ceiling_bytes_per_param = 0;
  double params_per_s() const { return params / seconds; }
  double gbps() const { return params * bytes_per_param / seconds / 1e9; }
  double ceiling_gbps() const { return params * ceiling_bytes_per_param / ceiling_seconds / 1e9; }
};

template <class Fn>
double time_median(int reps, Fn&& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  return median(t);
}

// Muon's step on one matrix: the whole step and its Newton-Schulz iteration, next to the
// iteration's three products alone (the same GEMMs on the same operands, nothing between them: the
// iteration's ceiling) and a square sgemm of the shorter side's size.
struct MuonRow {
  int64_t rows = 0, cols = 0;
  int threads = 0;
  double step_s = 0, ns_s = 0, gemms_s = 0;
  double ns_flops() const {
    const double n = static_cast<double>(std::min(rows, cols)), m = static_cast<double>(std::max(rows, cols));
    return 5 * (4 * n * n * m + 2 * n * n * n);  // 5 iterations: X X^T, A A, B X
  }
};

MuonRow time_muon(int64_t rows, int64_t cols, int threads, int reps) {
  const size_t count = static_cast<size_t>(rows) * cols;
  std::vector<float> p(count, 0.5f), g(count), m(count, 0.0f), u(count), scratch(muon_scratch_floats(rows, cols));
  for (size_t i = 0; i < count; ++i) g[i] = 1e-3f * static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 5e-4f;
  MuonRow r{rows, cols, threads};
  const MuonParams params;
  r.step_s = time_median(reps, [&] { cpu_muon_step(params, {p.data(), g.data(), m.data(), rows, cols, 0.02}, scratch.data()); });
  r.ns_s = time_median(reps, [&] { newton_schulz(g.data(), u.data(), rows, cols, 5, scratch.data()); });
  const int64_t n = std::min(rows, cols), w = std::max(rows, cols);
  float *x = scratch.data(), *y = x + n * w, *a = y + n * w, *b = a + n * n;
  r.gemms_s = time_median(reps, [&] {
    for (int s = 0; s < 5; ++s) {
      cpu::sgemm(false, true, n, n, w, 1.0f, x, w, x, w, 0.0f, a, n);
      cpu::sgemm(false, false, n, n, n, 1.0f, a, n, a, n, 0.0f, b, n);
      cpu::sgemm(false, false, n, w, n, 1.0f, b, n, x, w, 1.0f, y, w);
    }
  });
  return r;
}

size_t parse_count(const std::string& text) {
  const double v = std::stod(text);
  ZEROTH_CHECK(v >= 1 && v <= 4e9, "--params {} is out of range (1 .. 4e9)", text);
  return static_cast<size_t>(v);
}

// PyTorch's AdamW (foreach) on the same sizes and threads, in a child Python process. Returns
// one JSON object per (params, threads), or nothing when torch is not installed.
constexpr const char* kTorchScript = R"PY(
import json, sys, time
import torch
sizes = [int(x) for x in sys.argv[1].split(",")]
threads = [int(x) for x in sys.argv[2].split(",")]
reps = int(sys.argv[3])
out = []
for t in threads:
    torch.set_num_threads(t)
    for n in sizes:
        p = torch.nn.Parameter(torch.randn(n))
        p.grad = torch.randn(n) * 1e-3
        opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, foreach=True)
        opt.step()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        times.sort()
        out.append({"params": n, "threads": t, "seconds": times[len(times) // 2]})
        del opt, p
print(json.dumps(out))
)PY";

nlohmann::json run_torch(const std::vector<size_t>& sizes, const std::vector<int>& threads, int reps, bool tuned_malloc) {
  // No interpreter or no torch: no comparison, as the help says.
  try {
    if (run_process({"/usr/bin/python3", "-c", "import torch"}).status != 0) return nullptr;
  } catch (const IoError&) {
    return nullptr;
  }
  const std::string script = fmt::format("/tmp/zeroth_torch_adamw_{}.py", ::getpid());
  std::ofstream(script) << kTorchScript;
  std::string sz, th;
  for (auto s : sizes) sz += (sz.empty() ? "" : ",") + std::to_string(s);
  for (auto t : threads) th += (th.empty() ? "" : ",") + std::to_string(t);
  // glibc returns large freed blocks to the OS by default, so every torch step pays page faults
  // for its temporaries; these settings keep them (MACHINE.md).
  std::map<std::string, std::string> env;
  if (tuned_malloc) {
    env = {{"MALLOC_MMAP_THRESHOLD_", "17179869184"}, {"MALLOC_TRIM_THRESHOLD_", "17179869184"}, {"MALLOC_TOP_PAD_", "1073741824"}};
  }
  const ProcessResult torch = run_process({"/usr/bin/python3", script, sz, th, std::to_string(reps)}, env);
  std::remove(script.c_str());
  if (torch.status != 0) return nullptr;
  const std::string& text = torch.out;
  try {
    return nlohmann::json::parse(text);
  } catch (...) {
    return nullptr;
  }
}

// The fused CUDA steps (AdamW; Lamb's two passes) next to a device-to-device copy of the same
// number of bytes.
void run_cuda(const Options& o, const std::vector<size_t>& sizes) {
  auto device = make_device(o.device);
  auto& s = device->default_stream();
  OptimizerParams adamw, lamb;
  adamw.weight_decay = 0.01;
  lamb.kind = OptimizerKind::lamb;
  lamb.weight_decay = 0.01;
  std::printf("zeroth bench optim on %s: fused AdamW and Lamb steps vs a device-to-device copy of the same bytes, median of %d\n",
              device->name().c_str(), o.reps);
  std::printf("%6s %12s %5s %5s %12s %10s %14s %8s\n", "step", "params", "grads", "copy", "Gparams/s", "GB/s", "copy GB/s", "vs copy");
  for (size_t n : sizes) {
    Buffer p = device->allocate(n * 4, MemTag::params), g = device->allocate(n * 4, MemTag::grads);
    Buffer m = device->allocate(n * 4, MemTag::optimizer), v = device->allocate(n * 4, MemTag::optimizer);
    Buffer out = device->allocate(n * 2, MemTag::params);
    for (Buffer* b : {&p, &g, &m, &v}) device->fill(s, b->view(DType::f32), 1e-3f);
    for (const OptimizerParams* opt : {&adamw, &lamb}) {
      for (bool copy : {false, true}) {
        OptimizerStep step{p.as<float>(), g.data(), DType::f32, {m.as<float>(), v.as<float>()}, copy ? out.data() : nullptr,
                           DType::bf16,   n};
        step.check_finite = false;
        int64_t number = 1;
        const double t = time_median(o.reps, [&] {
          OptimizerStep st = step;
          st.step = number++;
          cuda_optimizer_step(*opt, {&st, 1}, s);
          s.synchronize();
        });
        const size_t bytes = n * optimizer_bytes_per_param(opt->kind, DType::f32, copy, DType::bf16);
        // The copy moves bytes / 2 each way: read + write counted like the step's.
        Buffer a = device->allocate(bytes / 2, MemTag::buffers), b = device->allocate(bytes / 2, MemTag::buffers);
        const double tc = time_median(o.reps, [&] {
          device->copy(s, b.data(), a.data(), bytes / 2);
          s.synchronize();
        });
        std::printf("%6s %12zu %5s %5s %12.2f %10.1f %14.1f %7.0f%%\n", std::string(optimizer_name(opt->kind)).c_str(), n, "f32",
                    copy ? "bf16" : "-", n / t / 1e9, bytes / t / 1e9, bytes / tc / 1e9, 100 * tc / t);
      }
    }
  }
}

// Long: the timing loops (sizes, threads, gradient dtype, copy-out; AdamW, the ceiling and Lamb alternating), then PyTorch's
// figures and the JSON or the table, which read the same rows.
void run(const Options& o) {
  std::vector<size_t> sizes;
  for (const auto& p : o.params) sizes.push_back(parse_count(p));
  if (o.device != "cpu") return run_cuda(o, sizes);
  std::vector<int> threads = o.threads;
  const int all = cpu::num_threads();
  if (threads.empty()) threads = all > 1 ? std::vector<int>{1, all} : std::vector<int>{1};

  auto device = make_device("cpu");
  std::vector<Row> rows;
  OptimizerParams adamw, lamb;
  adamw.kind = OptimizerKind::adamw;
  adamw.weight_decay = 0.01f;
  lamb.kind = OptimizerKind::lamb;
  lamb.weight_decay = 0.01f;
  for (size_t n : sizes) {
    // Allocated (and touched) once per size; steps reuse them, as the engine's shards do.
    Buffer p = device->allocate(n * 4, MemTag::params), g = device->allocate(n * 4, MemTag::grads);
    Buffer m = device->allocate(n * 4, MemTag::optimizer), v = device->allocate(n * 4, MemTag::optimizer);
    Buffer out = device->allocate(n * 2, MemTag::params), g16 = device->allocate(n * 2, MemTag::grads);
    auto& s = device->default_stream();
    device->fill(s, p.view(DType::f32), 0.5f);
    device->fill(s, g.view(DType::f32), 1e-3f);
    device->fill(s, g16.view(DType::bf16), 1e-3f);
    device->fill(s, m.view(DType::f32), 0.0f);
    device->fill(s, v.view(DType::f32), 0.0f);
    s.synchronize();
    for (int t : threads) {
      cpu::set_num_threads(t);
      for (DType gt : {DType::f32, DType::bf16}) {
        for (bool copy : {false, true}) {
          OptimizerStep step;
          step.params = p.as<float>();
          step.grads = gt == DType::f32 ? g.data() : g16.data();
          step.grad_type = gt;
          step.state[0] = m.as<float>();
          step.state[1] = v.as<float>();
          step.copy_out = copy ? out.data() : nullptr;
          step.count = n;
          step.check_finite = false;  // the engine checks overflow itself before stepping
          int64_t number = 1;
          const size_t ceiling_bytes = optimizer_bytes_per_param(OptimizerKind::adamw, gt, copy, DType::bf16);
          Row a{"AdamW", n, t, std::string(dtype_name(gt)), copy};
          a.bytes_per_param = a.ceiling_bytes_per_param = ceiling_bytes;
          Row l{"Lamb", n, t, std::string(dtype_name(gt)), copy};
          l.bytes_per_param = optimizer_bytes_per_param(OptimizerKind::lamb, gt, copy, DType::bf16);
          l.ceiling_bytes_per_param = ceiling_bytes;
          // Steps and ceiling alternate, so all see the same (noisy) memory system; the whole
          // array is one tensor for Lamb (both passes, the norms in between).
          std::vector<double> adamw_times, lamb_times, ceiling_times;
          for (int rep = 0; rep <= o.reps; ++rep) {
            auto t0 = clock::now();
            step.step = number++;
            cpu_optimizer_step(adamw, step);
            auto t1 = clock::now();
            cpu_optimizer_stream_ceiling(step);
            auto t2 = clock::now();
            cpu_optimizer_step(lamb, step);
            auto t3 = clock::now();
            if (rep == 0) continue;  // warm-up
            adamw_times.push_back(std::chrono::duration<double>(t1 - t0).count());
            ceiling_times.push_back(std::chrono::duration<double>(t2 - t1).count());
            lamb_times.push_back(std::chrono::duration<double>(t3 - t2).count());
          }
          a.seconds = median(adamw_times);
          l.seconds = median(lamb_times);
          a.ceiling_seconds = l.ceiling_seconds = median(ceiling_times);
          rows.push_back(a);
          rows.push_back(l);
        }
      }
    }
  }
  std::vector<MuonRow> muon;
  for (const std::string& shape : o.muon) {
    const size_t x = shape.find('x');
    ZEROTH_CHECK(x != std::string::npos, "--muon {}: give a matrix as ROWSxCOLS, e.g. 1024x4096", shape);
    const int64_t r = std::stoll(shape.substr(0, x)), c = std::stoll(shape.substr(x + 1));
    ZEROTH_CHECK(r >= 1 && c >= 1 && r * c <= (int64_t{1} << 28), "--muon {}: each side at least 1, at most 2^28 elements", shape);
    for (int t : threads) {
      cpu::set_num_threads(t);
      muon.push_back(time_muon(r, c, t, o.reps));
    }
  }
  cpu::set_num_threads(all);

  nlohmann::json torch_default, torch_tuned;
  if (o.torch) {
    torch_tuned = run_torch(sizes, threads, o.reps, true);
    torch_default = run_torch(sizes, threads, o.reps, false);
  }
  auto torch_seconds = [](const nlohmann::json& t, size_t n, int threads) {
    if (!t.is_array()) return 0.0;
    for (const auto& e : t) {
      if (e["params"].get<size_t>() == n && e["threads"].get<int>() == threads) return e["seconds"].get<double>();
    }
    return 0.0;
  };

  if (o.json) {
    nlohmann::json j;
    double ceiling = 0;
    j["results"] = nlohmann::json::array();
    for (const auto& r : rows) {
      ceiling = std::max(ceiling, r.ceiling_gbps());
      j["results"].push_back({{"optimizer", r.optimizer},
                              {"params", r.params},
                              {"threads", r.threads},
                              {"grad_dtype", r.grad_dtype},
                              {"copy_out", r.copy_out},
                              {"bytes_per_param", r.bytes_per_param},
                              {"params_per_s", r.params_per_s()},
                              {"gbps", r.gbps()},
                              {"ceiling_gbps", r.ceiling_gbps()},
                              {"vs_ceiling", r.gbps() / r.ceiling_gbps()}});
    }
    j["ceiling_gbps"] = ceiling;
    j["muon"] = nlohmann::json::array();
    for (const auto& r : muon) {
      j["muon"].push_back({{"rows", r.rows},
                           {"cols", r.cols},
                           {"threads", r.threads},
                           {"step_s", r.step_s},
                           {"newton_schulz_s", r.ns_s},
                           {"gemms_s", r.gemms_s},
                           {"newton_schulz_gflops", r.ns_flops() / r.ns_s / 1e9},
                           {"vs_gemms", r.gemms_s / r.ns_s}});
    }
    j["simd"] = cpu::simd_level_name(cpu::active_simd_level());
    j["torch"] = nlohmann::json::array();
    for (const auto* t : {&torch_tuned, &torch_default}) {
      if (!t->is_array()) continue;
      for (auto e : *t) {
        e["malloc"] = t == &torch_tuned ? "tuned" : "default";
        e["params_per_s"] = e["params"].get<double>() / e["seconds"].get<double>();
        j["torch"].push_back(e);
      }
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("zeroth bench optim: AdamW and Lamb steps on the CPU (%s kernels), median of %d; GB/s counts the bytes the "
              "step must move (B/p), the ceiling streams AdamW's\n",
              std::string(cpu::simd_level_name(cpu::active_simd_level())).c_str(), o.reps);
  std::printf("%6s %12s %7s %5s %5s %4s %12s %8s %12s %8s %13s %13s\n", "step", "params", "threads", "grads", "copy", "B/p",
              "Mparams/s", "GB/s", "ceiling GB/s", "vs ceil", "torch tuned", "torch default");
  for (const auto& r : rows) {
    const bool vs_torch = r.optimizer == "AdamW" && r.grad_dtype == "f32" && !r.copy_out;
    const double tt = vs_torch ? torch_seconds(torch_tuned, r.params, r.threads) : 0;
    const double td = vs_torch ? torch_seconds(torch_default, r.params, r.threads) : 0;
    auto ratio = [&](double torch_s) { return torch_s > 0 ? fmt::format("{:.2f}x", torch_s / r.seconds) : std::string("-"); };
    std::printf("%6s %12zu %7d %5s %5s %4zu %12.1f %8.2f %12.2f %7.0f%% %13s %13s\n", r.optimizer.c_str(), r.params, r.threads,
                r.grad_dtype.c_str(), r.copy_out ? "bf16" : "-", r.bytes_per_param, r.params_per_s() / 1e6, r.gbps(), r.ceiling_gbps(),
                100 * r.gbps() / r.ceiling_gbps(), ratio(tt).c_str(), ratio(td).c_str());
  }
  if (!muon.empty()) {
    std::printf("\nMuon, one matrix (Newton-Schulz: 5 iterations in f32 on the GEMM library); the GEMMs: the iteration's three "
                "products alone, its ceiling\n");
    std::printf("%12s %7s %10s %14s %10s %12s %8s\n", "matrix", "threads", "step ms", "iteration ms", "GFLOP/s", "GEMMs GFLOP/s",
                "vs GEMMs");
    for (const auto& r : muon) {
      std::printf("%12s %7d %10.2f %14.2f %10.1f %12.1f %7.0f%%\n", fmt::format("{}x{}", r.rows, r.cols).c_str(), r.threads,
                  r.step_s * 1e3, r.ns_s * 1e3, r.ns_flops() / r.ns_s / 1e9, r.ns_flops() / r.gemms_s / 1e9, 100 * r.gemms_s / r.ns_s);
    }
  }
  if (!o.torch) std::printf("(PyTorch skipped: --no-torch)\n");
  else if (!torch_tuned.is_array()) std::printf("(PyTorch not measured: /usr/bin/python3 cannot import torch)\n");
  else std::printf("(torch columns: zeroth's speed-up over torch.optim.AdamW(foreach=True), f32 grads, same threads)\n");
}

}  // namespace bench_optim

void add_bench_optim_command(CLI::App& bench) {
  using namespace bench_optim;
  auto options = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("optim", "CPU AdamW and Lamb steps: params/s and GB/s next to a ceiling kernel and PyTorch");
  cmd->add_option("--device", options->device, "cpu (default) or cuda[:N]");
  cmd->add_option("--params", options->params, "Parameter counts (default 1e6 1e7 1e8)");
  cmd->add_option("--threads", options->threads, "Thread counts (default 1 and all)");
  cmd->add_option("--reps", options->reps, "Timed steps; the median is reported");
  cmd->add_flag("!--no-torch", options->torch, "Skip the PyTorch comparison");
  cmd->add_flag("--json", options->json, "Print JSON");
  cmd->add_option("--muon", options->muon,
                  "Muon's matrices, ROWSxCOLS (default 1024x1024 1024x4096 4096x1024): its step and Newton-Schulz iteration next "
                  "to the iteration's GEMMs alone");
  cmd->callback([options] { run(*options); });
}

}  // namespace zeroth::tools
