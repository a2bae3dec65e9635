// The environment table and its parsers.
#include "core/env.h"

#include <charconv>  // std::from_chars
#include <cstdlib>   // std::getenv

#include "core/error.h"

namespace zeroth::env {

namespace {
constexpr Variable kVariables[] = {
    {kLogLevel, "info", "log level: trace, debug, info, warn, error, off"},
    {kSimd, "best", "highest CPU kernel level to dispatch to: scalar, avx2, avx512"},
    {kNumThreads, "all cores", "threads for CPU kernels (oneTBB)"},
    {kGemm, "onednn (openblas without AVX2)", "the CPU matrix products' library: onednn or openblas"},
    {kCommTimeout, "300", "seconds a collective waits for its peers before failing"},
    {kCommCheck, "0", "1: compare each collective's sequence, op, count and dtype across ranks"},
    {kSocketIfname, "auto", "network interface for the Gloo transport"},
    {kJobToken, "", "the job's secret: the rendezvous store refuses connections without it", true},
    {kJobTokenFile, "", "a file (mode 600) holding the job's secret, read when ZEROTH_JOB_TOKEN is unset"},
    {kJobStarted, "", "set by zeroth launch: when it started the job (seconds since the epoch), for restarts"},
    {kRestartCount, "0", "times zeroth launch has restarted the job; above 0 zeroth train resumes from its checkpoints"},
    {kIoFault, "", "OP:ERROR:OFFSET[:FILE]: one file transfer made to fail (read|write, EIO|ENOSPC|short), for tests"},
    {kPlanJson, "", "file the engine writes its plan to (rank 0, JSON)"},
};
}  // namespace

std::span<const Variable> all() { return kVariables; }

std::optional<std::string> get(std::string_view name) {
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<int64_t> get_int(std::string_view name) {
  auto text = get(name);
  if (!text) return std::nullopt;
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size()) {
    ZEROTH_THROW(ConfigError, "environment variable {}='{}' is not an integer", name, *text);
  }
  return value;
}

}  // namespace zeroth::env
