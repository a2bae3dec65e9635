// What `zeroth bench offload` measured, and its two ways of saying so: a table with fio beside
// zeroth and DeepSpeed's `aio` section for the best setting, or JSON (--json).
#pragma once

#include <cstddef>   // std::size_t
#include <cstdint>   // uint64_t
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include "core/stats.h"           // median
#include "tools/bench/offload.h"  // CopyRates

namespace zeroth::tools {

struct Setting {
  std::size_t block_size = std::size_t{1} << 20;
  unsigned queue_depth = 8;
  unsigned threads = 1;
  bool sqpoll = false;
  bool registered = true;
};

struct Point {
  Setting setting;
  bool sqpoll_used = false, registered_used = false;  // what the kernel granted
  std::vector<double> write_gbps, read_gbps;
  std::vector<double> fio_write_gbps, fio_read_gbps;  // empty: fio not run at this point
  double write() const { return median(write_gbps); }
  double read() const { return median(read_gbps); }
  // The rate of writing the file and reading it back: what a swap out and in costs.
  double score() const { return 2.0 / (1.0 / write() + 1.0 / read()); }
};
// The engine's optimizer swapper at the sweep's best setting, a step after each raw pass.
struct SwapperResult {
  uint64_t params = 0, padded_params = 0;
  std::size_t sub_groups = 0;
  uint64_t sub_group_size = 0, read_bytes = 0, write_bytes = 0;
  std::vector<double> seconds, gbps;
  std::vector<double> vs_raw;  // each step against the raw rates of the pass just before it
  double vs_best = 0;          // the median rate against the sweep's best rates
  Point beside;                // the raw passes, one per step
};

struct OffloadResults {
  std::string path;
  std::size_t size = 0;
  int reps = 0;
  bool direct = false, io_uring = false;
  std::optional<std::string> fio_version;  // nullopt: fio did not run
  std::vector<Point> sweep;
  Point chosen;  // the sweep's point of highest score
  SwapperResult swapper;
  std::optional<CopyRates> copies;  // --device cuda
};

// The highest of the sweep's medians of `rate` (Point::write or Point::read).
double best_rate(const std::vector<Point>& sweep, double (Point::*rate)() const);

// The sweep table's header and one row per point, as the points are measured.
void print_sweep_header(const OffloadResults& r);
void print_row(const Point& p);
void print_offload_summary(const OffloadResults& r);
void print_offload_json(const OffloadResults& r);

}  // namespace zeroth::tools
