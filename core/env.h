// Every tunable zeroth reads from the environment, declared in one table so one grep finds
// them all; each is mirrored by a JSON config key or a CLI flag where one exists.
#pragma once

#include <cstdint>      // int64_t
#include <optional>     // std::optional
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view

namespace zeroth::env {

struct Variable {
  std::string_view name;
  std::string_view default_value;
  std::string_view meaning;
  bool secret = false;  // its value is never printed (`zeroth report` says only that it is set)
};

// ZEROTH_LOG_LEVEL: trace|debug|info|warn|error|off (default info).
inline constexpr std::string_view kLogLevel = "ZEROTH_LOG_LEVEL";
// ZEROTH_SIMD: cap the CPU kernel dispatch level: scalar|avx2|avx512 (default: best available).
inline constexpr std::string_view kSimd = "ZEROTH_SIMD";
// ZEROTH_NUM_THREADS: worker threads for CPU kernels (default: all cores).
inline constexpr std::string_view kNumThreads = "ZEROTH_NUM_THREADS";
// ZEROTH_GEMM: the CPU matrix products' library: onednn|openblas (default: oneDNN where the build
// has it and the CPU has AVX2).
inline constexpr std::string_view kGemm = "ZEROTH_GEMM";

// ZEROTH_COMM_TIMEOUT: seconds a collective waits for its peers before failing (default 300).
inline constexpr std::string_view kCommTimeout = "ZEROTH_COMM_TIMEOUT";
// ZEROTH_COMM_CHECK: 1 compares each collective's (sequence, op, count, dtype) across ranks.
inline constexpr std::string_view kCommCheck = "ZEROTH_COMM_CHECK";
// ZEROTH_SOCKET_IFNAME: network interface Gloo binds to (default: loopback for a local master,
// else the address the host name resolves to).
inline constexpr std::string_view kSocketIfname = "ZEROTH_SOCKET_IFNAME";

// ZEROTH_JOB_TOKEN: the job's shared secret; the rendezvous store refuses a connection that does
// not present it. `zeroth launch` makes one for its ranks when none is given.
inline constexpr std::string_view kJobToken = "ZEROTH_JOB_TOKEN";
// ZEROTH_JOB_TOKEN_FILE: a file (owner-only permissions) holding the token, for ranks that a
// scheduler starts; ZEROTH_JOB_TOKEN wins when both are set.
inline constexpr std::string_view kJobTokenFile = "ZEROTH_JOB_TOKEN_FILE";

// ZEROTH_RESTART_COUNT: how many times `zeroth launch --max-restarts` has started this job again
// (0 the first time); above 0 `zeroth train` resumes from run.checkpoint_dir as --resume would.
inline constexpr std::string_view kRestartCount = "ZEROTH_RESTART_COUNT";
// ZEROTH_JOB_STARTED: when `zeroth launch` started the job (seconds since the epoch); a restart
// resumes only from a checkpoint published since, never from an earlier run's.
inline constexpr std::string_view kJobStarted = "ZEROTH_JOB_STARTED";

// ZEROTH_IO_FAULT: OP:ERROR:OFFSET[:FILE], one swap-file or checkpoint transfer made to fail
// (offload/io_fault.h), for tests of what a failing disk does to a run.
inline constexpr std::string_view kIoFault = "ZEROTH_IO_FAULT";

// ZEROTH_PLAN_JSON: path; the engine writes rank 0's plan there as JSON when it is made.
inline constexpr std::string_view kPlanJson = "ZEROTH_PLAN_JSON";

// Not zeroth's own tunables, so not in all(): OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are read by
// OpenBLAS when it is loaded (the kernel set, the cache size it tiles for); zeroth reads them only
// to name them next to the core OpenBLAS runs (core/cpu/blas_info.h).
inline constexpr std::string_view kOpenblasCoretype = "OPENBLAS_CORETYPE";
inline constexpr std::string_view kOpenblasL2Size = "OPENBLAS_L2_SIZE";

std::span<const Variable> all();

// The raw value, or nullopt when unset or empty.
std::optional<std::string> get(std::string_view name);
// Parses an integer value; a malformed value raises ConfigError naming the variable.
std::optional<int64_t> get_int(std::string_view name);

}  // namespace zeroth::env
