// Leveled logging to stderr with an optional rank prefix; the level comes from ZEROTH_LOG_LEVEL.
#pragma once

#include <string_view>  // std::string_view

#include <fmt/format.h>  // fmt::format_string

namespace zeroth::log {

enum class Level { trace = 0, debug, info, warn, error, off };

Level level();
void set_level(Level level);
// Parses "info", "warn", ...; unknown names raise ConfigError listing the valid ones.
Level parse_level(std::string_view name);
// Rank shown as "[rank N]" before each line; -1 (default) shows none. A process-wide rank for
// one rank per process; a thread rank (which wins) for ranks that are threads of one process.
void set_rank(int rank);
void set_thread_rank(int rank);
void write(Level level, std::string_view message);

template <typename... Args>
void log(Level lvl, fmt::format_string<Args...> format, Args&&... args) {
  if (lvl < level()) return;
  write(lvl, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace zeroth::log

#define ZLOG_TRACE(...) ::zeroth::log::log(::zeroth::log::Level::trace, __VA_ARGS__)
#define ZLOG_DEBUG(...) ::zeroth::log::log(::zeroth::log::Level::debug, __VA_ARGS__)
#define ZLOG_INFO(...) ::zeroth::log::log(::zeroth::log::Level::info, __VA_ARGS__)
#define ZLOG_WARN(...) ::zeroth::log::log(::zeroth::log::Level::warn, __VA_ARGS__)
#define ZLOG_ERROR(...) ::zeroth::log::log(::zeroth::log::Level::error, __VA_ARGS__)
