// `zeroth report`: what this machine offers zeroth (like DeepSpeed's ds_report). Every probe is
// guarded, so the report also runs on a broken machine and says what is wrong.
#include <liburing.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <tbb/info.h>
#include <tbb/version.h>
#include <unistd.h>

#include <gloo/config.h>
#include <gloo/transport/tcp/device.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <nlohmann/json.hpp>

#include "comm/nccl/nccl_comm.h"
#include "core/cpu/blas_info.h"
#include "core/cpu/gemm.h"  // measure_gemm, gemm_library
#include "core/cpu/kernels.h"
#include "core/cuda/cuda_info.h"
#include "core/env.h"
#include "core/memory.h"
#include "tools/cli/commands.h"

namespace zeroth::tools {
namespace report_cmd {

// Runs a probe; an exception becomes its message, so one broken component cannot end the report.
std::string guarded(const std::function<std::string()>& probe) {
  try {
    return probe();
  } catch (const std::exception& e) {
    return fmt::format("probe failed: {}", e.what());
  } catch (...) {
    return "probe failed";
  }
}

std::string cpu_line() {
  const auto& f = cpu::cpu_features();
  std::string flags;
  auto add = [&](bool on, const char* name) {
    if (on) flags += flags.empty() ? name : fmt::format(" {}", name);
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512dq, "avx512dq");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.avx512_fp16, "avx512_fp16");
  add(f.amx_bf16, "amx_bf16");
  return fmt::format("{} [{}]", f.brand.empty() ? "unknown CPU" : f.brand, flags.empty() ? "baseline x86-64" : flags);
}

std::string kernel_line() {
  std::string levels;
  for (auto l : cpu::supported_simd_levels()) levels += fmt::format("{}{}", levels.empty() ? "" : ", ", cpu::simd_level_name(l));
  return fmt::format("{} (supported: {})", cpu::simd_level_name(cpu::active_simd_level()), levels);
}

std::string cuda_line(nlohmann::json& gpus) {
  const CudaInfo info = cuda_info();
  if (!info.compiled) return info.problem;
  std::string line = fmt::format("runtime {}.{}, driver {}", info.runtime_version / 1000, info.runtime_version % 1000 / 10,
                                 info.driver_version == 0
                                     ? std::string("none")
                                     : fmt::format("{}.{}", info.driver_version / 1000, info.driver_version % 1000 / 10));
  for (const auto& g : info.gpus) {
    gpus.push_back({{"index", g.index},
                    {"name", g.name},
                    {"memory_bytes", g.total_memory},
                    {"compute_capability", fmt::format("{}.{}", g.cc_major, g.cc_minor)},
                    {"sms", g.multiprocessors}});
  }
  if (info.gpus.empty()) line += fmt::format("; GPUs: none ({})", info.problem);
  return line;
}

std::string nccl_line() { return nccl_version(); }

// Breaks `text` at spaces into lines of at most `width` characters; the first starts with `lead`,
// the others with as many spaces.
std::string wrap(const std::string& text, const std::string& lead, size_t width) {
  std::string out, line = lead;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(' ', pos);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(pos, end - pos);
    if (line.size() > lead.size() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line = std::string(lead.size(), ' ');
    }
    line += (line.size() > lead.size() ? " " : "") + word;
    pos = end + 1;
  }
  return out + line + "\n";
}

// Large enough that sgemm is compute-bound (about 0.1 s a call on AVX2 kernels, two cores).
constexpr int kSgemmSize = 2048;
constexpr int kSgemmReps = 5;

// The BLAS and GEMM rows: OpenBLAS's core and threads, the library the CPU's products run on
// with its kernels, each built library's checked sgemm rate, and a note when OpenBLAS's core is
// below the CPU. `blas` and `gemm` collect the same for --json.
std::string blas_lines(nlohmann::json& blas, nlohmann::json& gemm, std::string& library, std::string& sgemm, std::string& note) {
  const cpu::BlasInfo info = cpu::blas_info();
  blas = {{"version", info.version},
          {"config", info.config},
          {"core", info.core},
          {"threads", info.threads},
          {"core_isa", cpu::vector_isa_name(info.core_isa)},
          {"cpu_isa", cpu::vector_isa_name(info.cpu_isa)},
          {"below_cpu", info.below_cpu()},
          {"note", info.note()},
          {std::string(env::kOpenblasCoretype), info.coretype ? nlohmann::json(*info.coretype) : nlohmann::json(nullptr)},
          {std::string(env::kOpenblasL2Size), info.l2_size ? nlohmann::json(*info.l2_size) : nlohmann::json(nullptr)}};
  note = info.note();
  const cpu::GemmLibrary in_use = cpu::gemm_library();
  library = fmt::format("{} ({}={}; {} threads)", cpu::gemm_library_summary(in_use), env::kGemm, cpu::gemm_library_name(in_use),
                        cpu::gemm_threads());
  gemm = {{"library", cpu::gemm_library_name(in_use)}, {"summary", library}, {"threads", cpu::gemm_threads()}};
  sgemm = guarded([&] {
    std::vector<std::string> rates;
    for (const cpu::GemmLibrary l : {cpu::GemmLibrary::onednn, cpu::GemmLibrary::openblas}) {
      if (!cpu::gemm_library_built(l)) continue;
      const cpu::GemmRate r = cpu::measure_gemm(kSgemmSize, kSgemmReps, l);
      const nlohmann::json rate = {{"n", r.n}, {"reps", r.reps}, {"seconds", r.seconds}, {"gflops", r.gflops}};
      gemm[std::string(cpu::gemm_library_name(l))] = {{"summary", cpu::gemm_library_summary(l)}, {"sgemm", rate}};
      if (l == cpu::GemmLibrary::openblas) blas["sgemm"] = rate;
      rates.push_back(fmt::format("{} {:.0f} GFLOP/s", cpu::gemm_library_name(l), r.gflops));
    }
    return fmt::format("{} ({}x{}x{} f32, median of {}, {} thread{}, results exact)", fmt::join(rates, ", "), kSgemmSize, kSgemmSize,
                       kSgemmSize, kSgemmReps, cpu::gemm_threads(), cpu::gemm_threads() == 1 ? "" : "s");
  });
  return info.summary();
}

std::string uring_line() {
  io_uring ring{};
  const int rc = io_uring_queue_init(8, &ring, 0);
  if (rc < 0)
    return fmt::format("unusable: io_uring_queue_init(8) failed: {} (check kernel.io_uring_disabled and seccomp)", strerror(-rc));
  std::string line = "usable";
  if (io_uring_probe* probe = io_uring_get_probe_ring(&ring)) {
    line += fmt::format(" (read {}, write {}, fsync {})", io_uring_opcode_supported(probe, IORING_OP_READ) ? "yes" : "no",
                        io_uring_opcode_supported(probe, IORING_OP_WRITE) ? "yes" : "no",
                        io_uring_opcode_supported(probe, IORING_OP_FSYNC) ? "yes" : "no");
    io_uring_free_probe(probe);
  }
  io_uring_queue_exit(&ring);
  return line;
}

std::string gloo_line() {
  gloo::transport::tcp::attr attr("127.0.0.1");
  auto device = gloo::transport::tcp::CreateDevice(attr);
  return fmt::format("linked, TCP transport works ({})", device->str());
}

std::string memory_line() {
  struct sysinfo si {};
  if (sysinfo(&si) != 0) return fmt::format("sysinfo failed: {}", strerror(errno));
  const size_t unit = si.mem_unit;
  // offload's pin_memory page-locks host buffers with mlock on the CPU device: this limit caps it.
  rlimit lock{};
  const std::string lockable = getrlimit(RLIMIT_MEMLOCK, &lock) != 0 ? "unknown"
                               : lock.rlim_cur == RLIM_INFINITY      ? "unlimited"
                                                                     : format_bytes(lock.rlim_cur);
  return fmt::format("{} total, {} free, swap {}; page-lockable (RLIMIT_MEMLOCK, offload pin_memory) {}",
                     format_bytes(si.totalram * unit), format_bytes(si.freeram * unit), format_bytes(si.totalswap * unit), lockable);
}

void run_report(bool json_output) {
  nlohmann::json gpus = nlohmann::json::array();
  nlohmann::json blas = nlohmann::json::object(), gemm = nlohmann::json::object();
  std::string library, sgemm, blas_note;
  const std::string blas_line = guarded([&] { return blas_lines(blas, gemm, library, sgemm, blas_note); });
  struct utsname uts {};
  const std::string kernel = uname(&uts) == 0 ? fmt::format("{} {}", uts.sysname, uts.release) : "unknown";
  const std::pair<std::string, std::string> rows[] = {
      {"zeroth", std::string(ZEROTH_VERSION)},
      {"os", kernel},
      {"cpu", guarded(cpu_line)},
      {"cpu kernels", guarded(kernel_line)},
      {"threads", guarded([] {
         return fmt::format("{} (oneTBB {}, {} cores online)", cpu::num_threads(), TBB_VERSION_STRING, sysconf(_SC_NPROCESSORS_ONLN));
       })},
      {"memory", guarded(memory_line)},
      {"blas", blas_line},
      {"gemm", library},
      {"sgemm", sgemm},
      {"cuda", guarded([&] { return cuda_line(gpus); })},
      {"nccl", guarded(nccl_line)},
      {"io_uring", guarded(uring_line)},
      {"gloo", guarded(gloo_line)},
  };
  if (json_output) {
    nlohmann::json out;
    for (const auto& [key, value] : rows) out[key] = value;
    // One object: the summary line and the figures behind it.
    blas["summary"] = blas_line;
    out["blas"] = blas;
    out["gemm"] = gemm;
    out.erase("sgemm");
    out["gpus"] = gpus;
    nlohmann::json variables = nlohmann::json::object();
    for (const auto& v : env::all()) {
      auto value = env::get(v.name);
      variables[std::string(v.name)] = value ? nlohmann::json(v.secret ? "(set, not shown)" : *value) : nlohmann::json(nullptr);
    }
    out["environment"] = variables;
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  std::printf("zeroth report\n");
  for (const auto& [key, value] : rows) {
    std::printf("  %-12s %s\n", key.c_str(), value.c_str());
    if (key == "sgemm" && !blas_note.empty()) std::printf("%s", wrap(blas_note, "  blas note    ", 100).c_str());
  }
  for (const auto& g : gpus) {
    std::printf("  %-12s %s\n", fmt::format("gpu {}", g["index"].get<int>()).c_str(),
                fmt::format("{}, {}, cc {}, {} SMs", g["name"].get<std::string>(), format_bytes(g["memory_bytes"].get<size_t>()),
                            g["compute_capability"].get<std::string>(), g["sms"].get<int>())
                    .c_str());
  }
  std::printf("  environment:\n");
  for (const auto& v : env::all()) {
    auto value = env::get(v.name);
    const std::string shown = !value ? "unset" : v.secret ? "(set, not shown)" : *value;
    std::printf("    %-20s %-10s (%.*s)\n", std::string(v.name).c_str(), shown.c_str(), static_cast<int>(v.meaning.size()),
                v.meaning.data());
  }
}

}  // namespace report_cmd

void add_report_command(CLI::App& app) {
  using namespace report_cmd;
  auto* cmd = app.add_subcommand(
      "report", "Show versions, CPU features, BLAS core, GEMM library and sgemm speed, GPUs, NCCL, io_uring, Gloo, memory");
  auto json_output = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json_output, "Print JSON");
  cmd->callback([json_output] { run_report(*json_output); });
}

}  // namespace zeroth::tools
