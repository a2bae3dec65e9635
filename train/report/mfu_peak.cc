#include "train/report/mfu_peak.h"

#include <sched.h>   // sched_getaffinity
#include <unistd.h>  // getpid

#include <algorithm>   // std::max
#include <chrono>      // std::chrono::system_clock
#include <cstdlib>     // std::getenv
#include <ctime>       // std::time_t, gmtime_r
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream, std::ofstream

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "comm/rendezvous.h"   // rendezvous_from_env
#include "core/cpu/kernels.h"  // cpu_features
#include "core/cpu/gemm.h"     // measure_gemm

namespace zeroth::tools {
namespace {

namespace fs = std::filesystem;

fs::path cache_file() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') return fs::path(xdg) / "zeroth/mfu-peak.json";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') return fs::path(home) / ".cache/zeroth/mfu-peak.json";
  return {};
}

std::string today() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  return fmt::format("{:04}-{:02}-{:02}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
}

}  // namespace

Peak measure_peak(const TrainConfig& c) {
  // The CPU's rate says nothing of an accelerator's: MFU is left out there.
  if (c.run.device != "cpu") return {0, fmt::format("no peak measured for run.device {}: MFU is left out", c.run.device)};
  // A bf16 run's products run on bf16 kernels where oneDNN has them (models/kernels/cpu/row_kernels.h):
  // their rate is its peak.
  const bool bf16 = c.engine.compute_dtype == DType::bf16 && cpu::gemm_bf16_native();
  const std::string library = cpu::gemm_library_summary(cpu::gemm_library());
  const std::string brand = cpu::cpu_features().brand;
  const std::string key = fmt::format("{} | {} | {}", brand.empty() ? "unknown CPU" : brand, library, bf16 ? "bf16" : "f32");
  const fs::path file = cache_file();
  nlohmann::json cache = nlohmann::json::object();
  if (!file.empty()) {
    std::ifstream in(file);
    if (in) cache = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!cache.is_object()) cache = nlohmann::json::object();
  }
  double gflops = 0;
  std::string when;
  // A cache of another shape (edited by hand, written by another version) is measured again.
  const nlohmann::json kept = cache.contains(key) ? cache[key] : nlohmann::json();
  if (kept.is_object() && kept.contains("gflops_per_core") && kept["gflops_per_core"].is_number() &&
      kept["gflops_per_core"].get<double>() > 0) {
    gflops = kept["gflops_per_core"].get<double>();
    const bool dated = kept.contains("measured") && kept["measured"].is_string();
    when = fmt::format("measured {}, kept in {}", dated ? kept["measured"].get<std::string>() : "earlier", file.string());
  } else {
    const int threads = cpu::gemm_threads();
    cpu::set_gemm_threads(1);
    for (int i = 0; i < 3; ++i) gflops = std::max(gflops, cpu::measure_gemm(1024, 2, cpu::gemm_library(), bf16).gflops);
    cpu::set_gemm_threads(threads);
    cache[key] = {{"gflops_per_core", gflops}, {"measured", today()}};
    std::error_code ec;
    bool kept_now = false;
    if (!file.empty() && (fs::create_directories(file.parent_path(), ec), !ec)) {
      // A name of this process's own: runs started together each write theirs, the last rename wins.
      const fs::path tmp = fmt::format("{}.{}.tmp", file.string(), ::getpid());
      std::ofstream out(tmp);
      out << cache.dump(2) << "\n";
      out.flush();
      if (out) fs::rename(tmp, file, ec);
      kept_now = out && !ec;
      if (!kept_now) fs::remove(tmp, ec);
    }
    when = kept_now ? fmt::format("measured now, the best of 3, kept in {}", file.string())
                    : std::string("measured now, the best of 3; not kept (no writable cache folder)");
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  const auto launched = rendezvous_from_env();
  const int hosts = launched ? (launched->world_size + launched->local_world_size - 1) / launched->local_world_size : 1;
  return {gflops * 1e9 * cores * hosts,
          fmt::format("{:.0f} GFLOP/s: {} GEMM 1024^3 on one core {:.1f} GFLOP/s ({}; {}), x {} core{} x {} host{}",
                      gflops * cores * hosts, bf16 ? "bf16" : "f32", gflops, library, when, cores, cores == 1 ? "" : "s", hosts,
                      hosts == 1 ? "" : "s")};
}

}  // namespace zeroth::tools
