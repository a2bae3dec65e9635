// Tagged accounting and byte sizes.
#include "core/memory.h"

#include <cctype>    // isdigit, isspace
#include <charconv>  // std::from_chars
#include <cmath>     // std::isfinite
#include <cstdlib>   // std::strtoull
#include <fstream>   // std::ifstream
#include <string>    // std::string

#include "core/error.h"

namespace zeroth {

std::string_view mem_tag_name(MemTag tag) {
  constexpr std::string_view kNames[] = {"params", "grads", "optimizer", "buffers", "activations", "other"};
  const auto i = static_cast<size_t>(tag);
  return i < kMemTagCount ? kNames[i] : "invalid";
}

std::string format_bytes(size_t bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

size_t parse_bytes(std::string_view text) {
  const std::string original(text);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  size_t number_end = 0;
  while (number_end < text.size() && (std::isdigit(static_cast<unsigned char>(text[number_end])) || text[number_end] == '.')) {
    ++number_end;
  }
  double number = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + number_end, number);
  if (number_end == 0 || ec != std::errc() || ptr != text.data() + number_end) {
    ZEROTH_THROW(InvalidArgument, "'{}' is not a byte size (examples: 4096, 512MiB, 2GiB, 1.5GB)", original);
  }
  std::string unit(text.substr(number_end));
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  struct Unit {
    std::string_view name;
    double scale;
  };
  constexpr Unit kUnits[] = {{"", 1},
                             {"b", 1},
                             {"k", 1024.0},
                             {"kib", 1024.0},
                             {"kb", 1e3},
                             {"m", 1048576.0},
                             {"mib", 1048576.0},
                             {"mb", 1e6},
                             {"g", 1073741824.0},
                             {"gib", 1073741824.0},
                             {"gb", 1e9},
                             {"t", 1099511627776.0},
                             {"tib", 1099511627776.0},
                             {"tb", 1e12}};
  for (const auto& u : kUnits) {
    if (unit == u.name) {
      const double bytes = number * u.scale;
      if (!std::isfinite(bytes) || bytes > 1.8e19) {
        ZEROTH_THROW(InvalidArgument, "byte size '{}' is too large", original);
      }
      return static_cast<size_t>(bytes);
    }
  }
  ZEROTH_THROW(InvalidArgument, "'{}' has an unknown unit '{}' (use B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)", original, unit);
}

MemoryAccounting::MemoryAccounting(std::string device_name, size_t budget) : device_name_(std::move(device_name)), budget_(budget) {
  stats_.budget = budget;
}

std::string MemoryAccounting::describe_locked() const {
  std::string by_tag;
  for (size_t i = 0; i < kMemTagCount; ++i) {
    if (stats_.in_use[i] == 0) continue;
    if (!by_tag.empty()) by_tag += ", ";
    by_tag += fmt::format("{} {}", mem_tag_name(static_cast<MemTag>(i)), format_bytes(stats_.in_use[i]));
  }
  return by_tag.empty() ? "nothing" : by_tag;
}

void MemoryAccounting::charge(size_t bytes, MemTag tag) {
  std::lock_guard lock(mutex_);
  const auto t = static_cast<size_t>(tag);
  if (budget_ != 0 && (bytes > budget_ || stats_.total_in_use > budget_ - bytes)) {
    throw OutOfMemory(fmt::format("{} out of memory: requested {} ({} bytes) for '{}'; in use {} of budget {} (peak {}); "
                                  "in use by tag: {}. Lower the memory need (higher ZeRO stage, offload, smaller buckets or "
                                  "micro-batch) or raise the device memory budget",
                                  device_name_, format_bytes(bytes), bytes, mem_tag_name(tag), format_bytes(stats_.total_in_use),
                                  format_bytes(budget_), format_bytes(stats_.total_peak), describe_locked()));
  }
  stats_.in_use[t] += bytes;
  stats_.peak[t] = std::max(stats_.peak[t], stats_.in_use[t]);
  stats_.total_in_use += bytes;
  stats_.total_peak = std::max(stats_.total_peak, stats_.total_in_use);
}

void MemoryAccounting::release(size_t bytes, MemTag tag) {
  std::lock_guard lock(mutex_);
  const auto t = static_cast<size_t>(tag);
  ZEROTH_CHECK(stats_.in_use[t] >= bytes, "{}: releasing {} bytes of '{}' but only {} are in use", device_name_, bytes,
               mem_tag_name(tag), stats_.in_use[t]);
  stats_.in_use[t] -= bytes;
  stats_.total_in_use -= bytes;
}

bool MemoryAccounting::fits(size_t bytes) const {
  std::lock_guard lock(mutex_);
  return budget_ == 0 || (bytes <= budget_ && stats_.total_in_use <= budget_ - bytes);
}

MemoryStats MemoryAccounting::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void MemoryAccounting::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak = stats_.in_use;
  stats_.total_peak = stats_.total_in_use;
}

std::string MemoryAccounting::summary() const {
  std::lock_guard lock(mutex_);
  std::string text = fmt::format("{}: in use {}, peak {}", device_name_, format_bytes(stats_.total_in_use),
                                 format_bytes(stats_.total_peak));
  for (size_t i = 0; i < kMemTagCount; ++i) {
    if (stats_.peak[i] == 0) continue;
    text += fmt::format("; {} {} (peak {})", mem_tag_name(static_cast<MemTag>(i)), format_bytes(stats_.in_use[i]),
                        format_bytes(stats_.peak[i]));
  }
  return text;
}

namespace {

// A "<field>: <n> kB" line of a /proc file in bytes; 0 where the kernel does not report it.
size_t proc_bytes(const char* file, std::string_view field) {
  std::ifstream status(file);
  std::string line;
  while (std::getline(status, line)) {
    if (line.size() > field.size() && line.compare(0, field.size(), field) == 0 && line[field.size()] == ':')
      return static_cast<size_t>(std::strtoull(line.c_str() + field.size() + 1, nullptr, 10)) * 1024;
  }
  return 0;
}

}  // namespace

size_t process_peak_rss() { return proc_bytes("/proc/self/status", "VmHWM"); }
size_t process_rss() { return proc_bytes("/proc/self/status", "VmRSS"); }
size_t available_memory() { return proc_bytes("/proc/meminfo", "MemAvailable"); }

}  // namespace zeroth
