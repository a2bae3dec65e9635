// The logger: the one piece of global state zeroth keeps.
#include "core/log.h"

#include <atomic>  // std::atomic
#include <chrono>  // timestamps
#include <cstdio>  // fwrite
#include <mutex>   // one line at a time
#include <string>  // std::string

#include "core/env.h"
#include "core/error.h"

namespace zeroth::log {

namespace {
constexpr std::string_view kNames[] = {"trace", "debug", "info", "warn", "error", "off"};

Level initial_level() {
  try {
    if (auto name = env::get(env::kLogLevel)) return parse_level(*name);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "zeroth: %s; using info\n", e.what());
  }
  return Level::info;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> value{static_cast<int>(initial_level())};
  return value;
}

thread_local int tls_rank = -1;
std::atomic<int> process_rank{-1};
std::mutex write_mutex;
}  // namespace

Level level() { return static_cast<Level>(level_storage().load(std::memory_order_relaxed)); }
void set_level(Level lvl) { level_storage().store(static_cast<int>(lvl)); }

Level parse_level(std::string_view name) {
  for (size_t i = 0; i < std::size(kNames); ++i) {
    if (name == kNames[i]) return static_cast<Level>(i);
  }
  ZEROTH_THROW(ConfigError, "unknown log level '{}' (use trace, debug, info, warn, error or off)", name);
}

void set_rank(int rank) { process_rank.store(rank); }
void set_thread_rank(int rank) { tls_rank = rank; }

void write(Level lvl, std::string_view message) {
  using namespace std::chrono;
  static const auto start = steady_clock::now();
  const double t = duration<double>(steady_clock::now() - start).count();
  const int rank = tls_rank >= 0 ? tls_rank : process_rank.load();
  std::string line = rank >= 0 ? fmt::format("[{:8.3f}] [rank {}] {}: {}\n", t, rank, kNames[static_cast<int>(lvl)], message)
                               : fmt::format("[{:8.3f}] {}: {}\n", t, kNames[static_cast<int>(lvl)], message);
  std::lock_guard lock(write_mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace zeroth::log
