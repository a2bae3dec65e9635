// `zeroth bench offload`'s output: the sweep table and its summary, or one JSON object.
#include "tools/bench/offload_report.h"

#include <algorithm>  // std::max, std::minmax_element
#include <cstdio>     // std::printf

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/memory.h"  // format_bytes

namespace zeroth::tools {
namespace bench_offload_report {

double fio_best(const std::vector<Point>& sweep, bool write) {
  double best = 0;
  for (const auto& p : sweep)
    if (!p.fio_write_gbps.empty()) best = std::max(best, median(write ? p.fio_write_gbps : p.fio_read_gbps));
  return best;
}

// The median over the points fio ran at of zeroth's rate over fio's: less swayed than a ratio of
// two maxima by one lucky repetition where the disk's rate wanders.
double paired_ratio(const std::vector<Point>& sweep, bool write) {
  std::vector<double> ratios;
  for (const auto& p : sweep)
    if (!p.fio_write_gbps.empty()) ratios.push_back(write ? p.write() / median(p.fio_write_gbps) : p.read() / median(p.fio_read_gbps));
  return median(ratios);
}

}  // namespace bench_offload_report

double best_rate(const std::vector<Point>& sweep, double (Point::*rate)() const) {
  double best = 0;
  for (const auto& p : sweep) best = std::max(best, (p.*rate)());
  return best;
}

void print_row(const Point& p) {
  std::printf("%10s %6u %8u %7s %11s %11.2f %10.2f", format_bytes(p.setting.block_size).c_str(), p.setting.queue_depth,
              p.setting.threads, p.sqpoll_used ? "on" : "off", p.registered_used ? "yes" : "no", p.write(), p.read());
  if (!p.fio_write_gbps.empty()) std::printf(" %11.2f %10.2f", median(p.fio_write_gbps), median(p.fio_read_gbps));
  std::printf("\n");
  std::fflush(stdout);
}

namespace bench_offload_report {

nlohmann::json point_json(const Point& p) {
  nlohmann::json j = {{"block_size", p.setting.block_size},
                      {"queue_depth", p.setting.queue_depth},
                      {"threads", p.setting.threads},
                      {"sqpoll", p.sqpoll_used},
                      {"registered_buffer", p.registered_used},
                      {"write_gbps", p.write()},
                      {"read_gbps", p.read()},
                      {"write_runs", p.write_gbps},
                      {"read_runs", p.read_gbps}};
  if (!p.fio_write_gbps.empty()) {
    j["fio_write_gbps"] = median(p.fio_write_gbps);
    j["fio_read_gbps"] = median(p.fio_read_gbps);
  }
  return j;
}

// DeepSpeed's `aio` section at the setting, its keys in the order its documentation lists them.
nlohmann::ordered_json aio_section(const Point& chosen) {
  return {{"block_size", chosen.setting.block_size},
          {"queue_depth", chosen.setting.queue_depth},
          {"intra_op_parallelism", chosen.setting.threads},
          {"single_submit", false},
          {"overlap_events", true}};
}

}  // namespace bench_offload_report

void print_sweep_header(const OffloadResults& r) {
  using namespace bench_offload_report;
  std::printf("zeroth bench offload: %s file in %s, %s, sequential write then read, median of %d\n", format_bytes(r.size).c_str(),
              r.path.c_str(), r.direct ? "O_DIRECT" : "buffered (O_DIRECT refused)", r.reps);
  if (!r.io_uring) std::printf("io_uring is refused here: the workers run pread/pwrite\n");
  std::printf("%s\n",
              r.fio_version
                  ? fmt::format("reference: {} on the same file at every point: ioengine=io_uring, direct=1, same block size and "
                                "depth, numjobs = threads, sqthread_poll with sqpoll, fixedbufs where registered, registerfiles, "
                                "iodepth_batch_submit = depth, iodepth_batch_complete_min = depth / 2, iomem_align=2m with glibc's "
                                "huge-page malloc",
                                *r.fio_version)
                        .c_str()
                  : "reference: none (fio is not on PATH)");
  std::printf("%10s %6s %8s %7s %11s %11s %10s%s\n", "block", "depth", "threads", "sqpoll", "registered", "write GB/s", "read GB/s",
              r.fio_version ? "  fio write   fio read" : "");
}

void print_offload_json(const OffloadResults& r) {
  using namespace bench_offload_report;
  const double max_write = best_rate(r.sweep, &Point::write), max_read = best_rate(r.sweep, &Point::read);
  const double fio_write = fio_best(r.sweep, true), fio_read = fio_best(r.sweep, false);
  const SwapperResult& s = r.swapper;
  nlohmann::json out;
  out["path"] = r.path;
  out["size"] = r.size;
  out["reps"] = r.reps;
  out["direct"] = r.direct;
  out["io_uring"] = r.io_uring;
  out["best"] = {{"read_gbps", r.chosen.read()},
                 {"write_gbps", r.chosen.write()},
                 {"block_size", r.chosen.setting.block_size},
                 {"queue_depth", r.chosen.setting.queue_depth},
                 {"threads", r.chosen.setting.threads},
                 {"sqpoll", r.chosen.sqpoll_used},
                 {"registered_buffer", r.chosen.registered_used}};
  out["max"] = {{"read_gbps", max_read}, {"write_gbps", max_write}};
  out["fio"] = r.fio_version ? nlohmann::json{{"read_gbps", fio_read}, {"write_gbps", fio_write}, {"version", *r.fio_version}}
                             : nlohmann::json(nullptr);
  out["ratio"] = r.fio_version ? nlohmann::json{{"read", max_read / fio_read},
                                                {"write", max_write / fio_write},
                                                {"paired_read", paired_ratio(r.sweep, false)},
                                                {"paired_write", paired_ratio(r.sweep, true)}}
                               : nlohmann::json(nullptr);
  out["sweep"] = nlohmann::json::array();
  for (const auto& p : r.sweep) out["sweep"].push_back(point_json(p));
  out["aio"] = aio_section(r.chosen);
  out["cuda"] = r.copies ? nlohmann::json{{"bytes", r.copies->bytes},
                                          {"gpu", r.copies->gpu},
                                          {"h2d_pinned_gbps", r.copies->h2d_pinned},
                                          {"d2h_pinned_gbps", r.copies->d2h_pinned},
                                          {"h2d_pageable_gbps", r.copies->h2d_pageable},
                                          {"d2h_pageable_gbps", r.copies->d2h_pageable}}
                         : nlohmann::json(nullptr);
  out["swapper_gbps"] = median(s.gbps);
  out["swapper"] = {{"params", s.params},
                    {"padded_params", s.padded_params},
                    {"sub_groups", s.sub_groups},
                    {"sub_group_size", s.sub_group_size},
                    {"read_bytes", s.read_bytes},
                    {"write_bytes", s.write_bytes},
                    {"seconds", s.seconds},
                    {"gbps_runs", s.gbps},
                    {"raw_beside", point_json(s.beside)},
                    {"ratio_paired", median(s.vs_raw)},
                    {"ratio_to_best", s.vs_best}};
  std::printf("%s\n", out.dump(2).c_str());
}

void print_offload_summary(const OffloadResults& r) {
  using namespace bench_offload_report;
  const double max_write = best_rate(r.sweep, &Point::write), max_read = best_rate(r.sweep, &Point::read);
  const double fio_write = fio_best(r.sweep, true), fio_read = fio_best(r.sweep, false);
  const SwapperResult& s = r.swapper;
  std::printf("\nbest setting (write then read of the file): block %s, depth %u, %u thread(s)%s: write %.2f GB/s, read %.2f GB/s\n",
              format_bytes(r.chosen.setting.block_size).c_str(), r.chosen.setting.queue_depth, r.chosen.setting.threads,
              r.chosen.sqpoll_used ? ", sqpoll" : "", r.chosen.write(), r.chosen.read());
  if (r.fio_version) {
    std::printf("%-8s %12s %12s %8s %16s\n", "", "zeroth best", "fio best", "ratio", "paired (median)");
    std::printf("%-8s %12.2f %12.2f %7.0f%% %15.0f%%\n", "write", max_write, fio_write, 100 * max_write / fio_write,
                100 * paired_ratio(r.sweep, true));
    std::printf("%-8s %12.2f %12.2f %7.0f%% %15.0f%%\n", "read", max_read, fio_read, 100 * max_read / fio_read,
                100 * paired_ratio(r.sweep, false));
  }
  const auto [lo, hi] = std::minmax_element(s.gbps.begin(), s.gbps.end());
  std::printf("\noptimizer swapper (the engine's ZeRO-Infinity step on an MLP of %.2f M parameters, %zu sub-group(s) of at most "
              "%llu elements, aio as above): per step %s read and %s written (16 and 14 bytes per parameter: f32 master, moments "
              "and gradient in; master, moments and bf16 parameter out)\n",
              static_cast<double>(s.params) * 1e-6, s.sub_groups, static_cast<unsigned long long>(s.sub_group_size),
              format_bytes(s.read_bytes).c_str(), format_bytes(s.write_bytes).c_str());
  std::printf("  %.2f GB/s through the update (%.2f-%.2f over %d steps, each after a raw pass: write %.2f, read %.2f GB/s median)\n",
              median(s.gbps), *lo, *hi, r.reps, s.beside.write(), s.beside.read());
  std::printf("  against the time those bytes take at the raw rates measured just before each step (reads, then writes): %.0f%% "
              "(median over the steps); against the sweep's best rates: %.0f%%\n",
              100 * median(s.vs_raw), 100 * s.vs_best);
  std::printf("DeepSpeed config section for this disk:\n\"aio\": %s\n", aio_section(r.chosen).dump(2).c_str());
  if (r.copies) {
    std::printf("\n%s, %s copies, median of %d:\n", r.copies->gpu.c_str(), format_bytes(r.copies->bytes).c_str(), r.reps);
    std::printf("%-10s %14s %14s\n", "host", "to GPU GB/s", "from GPU GB/s");
    std::printf("%-10s %14.2f %14.2f\n", "pinned", r.copies->h2d_pinned, r.copies->d2h_pinned);
    std::printf("%-10s %14.2f %14.2f\n", "pageable", r.copies->h2d_pageable, r.copies->d2h_pageable);
  }
}

}  // namespace zeroth::tools
