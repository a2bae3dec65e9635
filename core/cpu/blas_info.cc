// OpenBLAS identity, for `zeroth report` and `zeroth bench train`.
#include "core/cpu/blas_info.h"

#include <cblas.h>  // openblas_get_corename, openblas_get_config

#include <algorithm>  // std::min, std::any_of, std::equal
#include <cctype>     // std::tolower
#include <iterator>   // std::begin
#include <vector>     // std::vector

#include <fmt/format.h>  // fmt::format

#include "core/cpu/kernels.h"  // cpu_features
#include "core/env.h"          // env::kOpenblasCoretype
#include "core/error.h"        // ZEROTH_CHECK, ZEROTH_THROW

namespace zeroth::cpu {

namespace {

bool same_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// OpenBLAS's x86 core names (driver/others/dynamic.c) by the widest instructions their sgemm
// kernels use. Zen runs the Haswell kernels.
constexpr std::string_view kAvx512Cores[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
constexpr std::string_view kAvx2Cores[] = {"Haswell", "Zen"};
constexpr std::string_view kOlderCores[] = {"Katmai",        "Coppermine",  "Northwood",  "Prescott",    "Banias", "Atom",
                                            "Core2",         "Penryn",      "Dunnington", "Nehalem",     "Athlon", "Opteron",
                                            "Opteron(SSE3)", "Barcelona",   "Nano",       "Sandybridge", "Bobcat", "Bulldozer",
                                            "Piledriver",    "Steamroller", "Excavator"};

VectorIsa cpu_vector_isa() {
  const CpuFeatures& f = cpu_features();  // already masked by what the OS saves
  if (f.avx512f) return VectorIsa::avx512;
  if (f.avx2 && f.fma) return VectorIsa::avx2;
  return VectorIsa::pre_avx2;
}

}  // namespace

std::string_view vector_isa_name(VectorIsa isa) {
  switch (isa) {
    case VectorIsa::pre_avx2: return "pre-AVX2";
    case VectorIsa::avx2: return "AVX2";
    case VectorIsa::avx512: return "AVX-512";
    case VectorIsa::unknown: break;
  }
  return "unknown";
}

VectorIsa blas_core_isa(std::string_view core) {
  auto in = [&](const auto& names) {
    return std::any_of(std::begin(names), std::end(names), [&](std::string_view n) { return same_ignoring_case(n, core); });
  };
  if (in(kAvx512Cores)) return VectorIsa::avx512;
  if (in(kAvx2Cores)) return VectorIsa::avx2;
  if (in(kOlderCores)) return VectorIsa::pre_avx2;
  return VectorIsa::unknown;
}

bool BlasInfo::below_cpu() const { return core_isa != VectorIsa::unknown && cpu_isa != VectorIsa::unknown && core_isa < cpu_isa; }

std::string BlasInfo::summary() const {
  std::string how = fmt::format("{} kernels", vector_isa_name(core_isa));
  if (coretype) how += fmt::format(", set by {}={}", env::kOpenblasCoretype, *coretype);
  if (l2_size) how += fmt::format(", {}={}", env::kOpenblasL2Size, *l2_size);
  if (below_cpu()) how += fmt::format("; this CPU runs {}", vector_isa_name(cpu_isa));
  return fmt::format("OpenBLAS {}, core {} ({}), {} thread{}", version, core, how, threads, threads == 1 ? "" : "s");
}

std::string BlasInfo::note() const {
  if (!below_cpu()) return {};
  if (coretype) {
    return fmt::format(
        "{}={} holds OpenBLAS to its {} kernels on a CPU that runs {}, so BLAS-bound steps run slower than this CPU allows. "
        "The pin is deliberate: some OpenBLAS builds compute wrong results or crash with their kernels for newer CPUs. "
        "Keep it for tests and CI, and compare throughput only between runs on the same core. A benchmark may unset it for "
        "zeroth and its reference alike (docs/PERFORMANCE.md); check first which core OpenBLAS picks then: "
        "`env -u {} zeroth report`.",
        env::kOpenblasCoretype, *coretype, vector_isa_name(core_isa), vector_isa_name(cpu_isa), env::kOpenblasCoretype);
  }
  return fmt::format(
      "OpenBLAS {} picked its {} kernels ({}) on a CPU that runs {}: it does not know this CPU model and fell back, so "
      "BLAS-bound steps run far slower than this CPU allows. {}=Haswell (AVX2) or SkylakeX (AVX-512), set before the "
      "process starts, selects wider kernels, at the risk any pin takes: kernels chosen for another CPU model can compute "
      "wrong results or crash; the sgemm check of `zeroth report` and the test suite show whether they do here.",
      version, vector_isa_name(core_isa), core, vector_isa_name(cpu_isa), env::kOpenblasCoretype);
}

BlasInfo blas_info() {
  BlasInfo info;
  info.config = openblas_get_config();
  info.core = openblas_get_corename();
  info.threads = openblas_get_num_threads();
  // The build string starts "OpenBLAS <version> ...".
  const auto first = info.config.find(' ');
  if (first != std::string::npos) info.version = info.config.substr(first + 1, info.config.find(' ', first + 1) - first - 1);
  info.core_isa = blas_core_isa(info.core);
  info.cpu_isa = cpu_vector_isa();
  info.coretype = env::get(env::kOpenblasCoretype);
  info.l2_size = env::get(env::kOpenblasL2Size);
  return info;
}

}  // namespace zeroth::cpu
