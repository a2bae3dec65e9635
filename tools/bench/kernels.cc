// `zeroth bench kernels`: bandwidth of the CPU element-wise kernels next to memcpy of the same
// bytes, measured in the same run (the ceiling on this machine, today).
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/cpu/kernels.h"
#include "core/device.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/stats.h"  // median_seconds
#include "tools/bench/bench.h"

namespace zeroth::tools {
namespace bench_kernels {

struct Options {
  std::string device = "cpu";
  std::string size = "256MiB";
  int threads = 0;
  int reps = 7;
  bool json = false;
};

struct Result {
  std::string name;
  size_t bytes = 0;  // read + written per call
  double median_s = 0;
};

// memcpy split into one large piece per thread: each call is big enough for glibc to use
// streaming stores, as the kernels do.
void parallel_memcpy(void* dst, const void* src, size_t bytes, int threads) {
  const size_t piece = (bytes / threads + 4095) / 4096 * 4096;
  tbb::parallel_for(0, threads, [&](int t) {
    const size_t begin = std::min(bytes, t * piece), end = std::min(bytes, begin + piece);
    std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin, end - begin);
  });
}

// Long: one line per kernel timed, after the memcpy ceiling, then the JSON or the table; the list reads as the table it prints.
void run(const Options& o) {
  const size_t array_bytes = parse_bytes(o.size);
  ZEROTH_CHECK(array_bytes >= 4096, "--size must be at least 4 KiB, got {}", o.size);
  ZEROTH_CHECK(o.reps >= 1, "--reps must be at least 1");
  const int threads = o.threads > 0 ? o.threads : cpu::num_threads();
  cpu::set_num_threads(threads);

  const size_t n = array_bytes / 4;  // f32 elements per array
  auto device = make_device(o.device);
  const bool on_cpu = device->kind() == DeviceKind::cpu;
  auto& stream = device->default_stream();
  Buffer a = device->allocate(n * 4, MemTag::buffers);
  Buffer b = device->allocate(n * 4, MemTag::buffers);
  Buffer h = device->allocate(n * 2, MemTag::buffers);
  Buffer scalars = device->allocate(8, MemTag::buffers);
  // Values that exercise rounding but stay finite, so the NaN fix-up paths stay cold as in training.
  std::vector<float> pattern(std::min<size_t>(n, size_t{1} << 20));
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = std::sin(0.37f * i) * 3.0f + 1e-3f * (i % 4096);
  for (size_t i = 0; i < n; i += pattern.size()) {
    device->copy(stream, a.as<float>() + i, pattern.data(), std::min(pattern.size(), n - i) * 4);
    stream.synchronize();
  }
  device->fill(stream, b.view(DType::f32), 0.5f);
  device->cast(stream, h.view(DType::bf16), a.view(DType::f32));
  stream.synchronize();

  auto on_stream = [&](auto&& enqueue) {
    return [&, enqueue] {
      enqueue();
      stream.synchronize();
    };
  };
  auto* sum_out = scalars.as<float>();
  auto* flag = reinterpret_cast<int32_t*>(scalars.as<float>() + 1);
  device->fill(stream, {flag, 1, DType::f32}, 0.0f);  // 0.0f has all-zero bits
  std::vector<Result> results;
  // The ceiling: a plain copy of the same bytes (memcpy on the host, device-to-device on a GPU).
  results.push_back(
      {on_cpu ? "memcpy" : "memcpy_d2d", 2 * n * 4,
       median_seconds(o.reps, on_cpu ? std::function<void()>([&] { parallel_memcpy(b.data(), a.data(), n * 4, threads); })
                                     : on_stream([&] { device->copy(stream, b.data(), a.data(), n * 4); }))});
  results.push_back({"cast_f32_bf16", n * 6,
                     median_seconds(o.reps, on_stream([&] { device->cast(stream, h.view(DType::bf16), a.view(DType::f32)); }))});
  results.push_back({"cast_bf16_f32", n * 6,
                     median_seconds(o.reps, on_stream([&] { device->cast(stream, b.view(DType::f32), h.view(DType::bf16)); }))});
  results.push_back({"cast_f32_f16", n * 6,
                     median_seconds(o.reps, on_stream([&] { device->cast(stream, h.view(DType::f16), a.view(DType::f32)); }))});
  results.push_back({"axpy", n * 12,
                     median_seconds(o.reps, on_stream([&] { device->axpy(stream, b.view(DType::f32), 1e-3f, a.view(DType::f32)); }))});
  results.push_back({"axpy_f32_bf16", n * 10, median_seconds(o.reps, on_stream([&] {
                                                               device->axpy(stream, b.view(DType::f32), 1e-3f, h.view(DType::bf16));
                                                             }))});
  results.push_back({"scale", n * 8, median_seconds(o.reps, on_stream([&] { device->scale(stream, b.view(DType::f32), 0.999f); }))});
  results.push_back(
      {"sumsq", n * 4, median_seconds(o.reps, on_stream([&] { device->sum_squares(stream, a.view(DType::f32), sum_out, false); }))});
  results.push_back({"sumsq_bf16", n * 2,
                     median_seconds(o.reps, on_stream([&] { device->sum_squares(stream, h.view(DType::bf16), sum_out, false); }))});
  results.push_back(
      {"nonfinite", n * 4, median_seconds(o.reps, on_stream([&] { device->flag_nonfinite(stream, a.view(DType::f32), flag); }))});

  const double memcpy_gbps = results[0].bytes / results[0].median_s / 1e9;
  if (o.json) {
    nlohmann::json out;
    out["memcpy_gbps"] = memcpy_gbps;
    out["device"] = device->name();
    out["threads"] = threads;
    out["simd"] = cpu::simd_level_name(cpu::active_simd_level());
    out["array_bytes"] = array_bytes;
    out["kernels"] = nlohmann::json::array();
    for (size_t i = 1; i < results.size(); ++i) {
      const double gbps = results[i].bytes / results[i].median_s / 1e9;
      out["kernels"].push_back({{"name", results[i].name},
                                {"gbps", gbps},
                                {"ratio", gbps / memcpy_gbps},
                                {"bytes", results[i].bytes},
                                {"median_ms", results[i].median_s * 1e3}});
    }
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  const std::string where = on_cpu
                                ? fmt::format("cpu, {} thread(s), {} kernels", threads, cpu::simd_level_name(cpu::active_simd_level()))
                                : device->name();
  std::printf("zeroth bench kernels: %s f32 arrays on %s, median of %d\n", format_bytes(array_bytes).c_str(), where.c_str(), o.reps);
  std::printf("%-16s %12s %11s %9s %10s\n", "kernel", "bytes moved", "median ms", "GB/s", "vs memcpy");
  for (const auto& r : results) {
    const double gbps = r.bytes / r.median_s / 1e9;
    std::printf("%-16s %12s %11.2f %9.2f %9.0f%%\n", r.name.c_str(), format_bytes(r.bytes).c_str(), r.median_s * 1e3, gbps,
                100.0 * gbps / memcpy_gbps);
  }
  std::printf("(bytes moved = bytes read + bytes written per call; the copy moves 2x the array)\n");
  int32_t host_flag = -1;
  device->copy(stream, &host_flag, flag, sizeof host_flag);
  stream.synchronize();
  if (host_flag != 0) std::printf("unexpected kernel result: nonfinite flag %d on finite data\n", host_flag);
}

}  // namespace bench_kernels

void add_bench_kernels_command(CLI::App& bench) {
  using namespace bench_kernels;
  auto options = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("kernels", "GB/s of cast, axpy, scale, sum of squares next to memcpy");
  cmd->add_option("--device", options->device, "cpu, cuda or cuda:N (default cpu)");
  cmd->add_option("--size", options->size, "Bytes per f32 array (default 256MiB)");
  cmd->add_option("--threads", options->threads, "Threads (default: all)");
  cmd->add_option("--reps", options->reps, "Timed repetitions; the median is reported");
  cmd->add_flag("--json", options->json, "Print JSON");
  cmd->callback([options] { run(*options); });
}

}  // namespace zeroth::tools
