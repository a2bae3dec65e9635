// Which OpenBLAS the CPU matmuls fall back to: the kernel set ("core") it picked when it was
// loaded, and whether that set uses what this CPU can do (gemm.h measures how fast it runs). OpenBLAS reads
// OPENBLAS_CORETYPE once at load time, and a core below the CPU halves sgemm or worse, so every
// throughput figure is only comparable next to the core it was measured with.
#pragma once

#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view

namespace zeroth::cpu {

// Widest vector instructions of a BLAS kernel set or of a CPU, as far as sgemm speed goes.
enum class VectorIsa { unknown, pre_avx2, avx2, avx512 };

struct BlasInfo {
  std::string version;  // "0.3.21", from the build string
  std::string config;   // openblas_get_config(): version, build options, core
  std::string core;     // openblas_get_corename(), e.g. "Haswell"
  int threads = 0;      // openblas_get_num_threads() now
  VectorIsa core_isa = VectorIsa::unknown;
  VectorIsa cpu_isa = VectorIsa::unknown;
  std::optional<std::string> coretype;  // OPENBLAS_CORETYPE, when set
  std::optional<std::string> l2_size;   // OPENBLAS_L2_SIZE, when set

  // The core's kernels are narrower than what this CPU runs.
  bool below_cpu() const;
  // One line: "OpenBLAS 0.3.21, core Haswell (AVX2 kernels, set by OPENBLAS_CORETYPE), 2 threads".
  std::string summary() const;
  // Empty, or why the core is below the CPU and what changing it costs.
  std::string note() const;
};

// Asks the OpenBLAS linked into this process; cheap (no computation).
BlasInfo blas_info();

std::string_view vector_isa_name(VectorIsa isa);
// The kernel width of an OpenBLAS x86 core name (case-insensitive); unknown for names not in the
// table.
VectorIsa blas_core_isa(std::string_view core);

}  // namespace zeroth::cpu
