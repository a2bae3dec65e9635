#include "core/cpu/gemm.h"

#include <cblas.h>  // cblas_sgemm, openblas_set_num_threads
#if ZEROTH_WITH_ONEDNN
#include <omp.h>                 // omp_set_num_threads: oneDNN's threads (Debian builds it on OpenMP)
#include <oneapi/dnnl/dnnl.hpp>  // dnnl::matmul: the bf16 products
#endif

#include <algorithm>  // std::max, std::min
#include <atomic>     // std::atomic
#include <chrono>     // std::chrono::steady_clock
#include <climits>    // INT_MAX
#include <map>        // std::map
#include <tuple>      // std::tuple
#include <vector>     // std::vector

#include <fmt/format.h>

#include "core/cpu/blas_info.h"  // blas_info
#include "core/cpu/kernels.h"    // cpu_features
#include "core/dtype.h"          // bf16_bits_to_f32, f32_to_bf16_bits
#include "core/env.h"            // env::kGemm
#include "core/error.h"
#include "core/stats.h"  // median

namespace zeroth::cpu {

namespace {

std::atomic<int> g_threads{0};  // 0: not set yet

// The checks of a BLAS's xerbla, stated; OpenBLAS takes int sizes.
void check_arguments(const char* what, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                     int64_t ldc) {
  const int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
  const bool sizes_ok = m >= 0 && n >= 0 && k >= 0 && m <= INT_MAX && n <= INT_MAX && k <= INT_MAX;
  if (!sizes_ok || lda < std::max<int64_t>(1, a_cols) || ldb < std::max<int64_t>(1, b_cols) || ldc < std::max<int64_t>(1, n) ||
      lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX) {
    ZEROTH_THROW(InvalidArgument,
                 "{}(trans_a={}, trans_b={}, M={}, N={}, K={}, lda={}, ldb={}, ldc={}): sizes must be in 0..{} and each row "
                 "stride at least its matrix's stored columns (A: {}, B: {}, C: {})",
                 what, trans_a, trans_b, m, n, k, lda, ldb, ldc, INT_MAX, a_cols, b_cols, n);
  }
}

// C = beta C, as a BLAS defines a product with K = 0 (beta 0 clears NaN too); oneDNN 2.6's sgemm
// leaves C as it was.
void scale_c(int64_t m, int64_t n, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0.0f : beta * c[i * ldc + j];
}

#if ZEROTH_WITH_ONEDNN
// OpenMP's thread count is per calling thread: each rank's thread sets its own once.
void use_gemm_threads() {
  const int threads = gemm_threads();
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
}

std::string_view onednn_isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    default: return "unknown";
  }
}

void onednn_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  use_gemm_threads();
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  const dnnl_status_t status = dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success) {
    ZEROTH_THROW(Error, "dnnl_sgemm('{}', '{}', M={}, N={}, K={}, alpha={}, lda={}, ldb={}, beta={}, ldc={}) failed: status {}", ta,
                 tb, m, n, k, alpha, lda, ldb, beta, ldc, static_cast<int>(status));
  }
}

// bf16 products on oneDNN's matmul primitive, made once per shape and kept by the thread that
// made it: with the library's scratchpad (Debian's build), a primitive must run on the thread that
// created it. alpha is an output scale, beta a sum post-op.
class MatmulCache {
 public:
  void run(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda, const uint16_t* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
    using dt = dnnl::memory::data_type;
    const Key key{trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, gemm_threads()};
    auto it = made_.find(key);
    if (it == made_.end()) {
      // Shapes that change from call to call (an expert's rows, a prompt's length) would make a
      // primitive each: past a bound the thread starts over.
      if (made_.size() >= kMaxPrimitives) made_.clear();
      const dnnl::memory::desc a_md({m, k}, dt::bf16, trans_a ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
      const dnnl::memory::desc b_md({k, n}, dt::bf16, trans_b ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
      const dnnl::memory::desc c_md({m, n}, dt::f32, dnnl::memory::dims{ldc, 1});
      dnnl::primitive_attr attr;
      if (alpha != 1) attr.set_output_scales(0, {alpha});
      if (beta != 0) {
        dnnl::post_ops sum;
        sum.append_sum(beta);
        attr.set_post_ops(sum);
      }
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine_);
      it = made_.emplace(key, Made{dnnl::matmul(pd), a_md, b_md, c_md}).first;
    }
    const Made& p = it->second;
    dnnl::memory am(p.a, engine_, const_cast<uint16_t*>(a)), bm(p.b, engine_, const_cast<uint16_t*>(b)), cm(p.c, engine_, c);
    p.matmul.execute(stream_, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream_.wait();
  }

 private:
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float, int>;
  static constexpr size_t kMaxPrimitives = 256;
  struct Made {
    dnnl::matmul matmul;
    dnnl::memory::desc a, b, c;
  };
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  std::map<Key, Made> made_;
};

void onednn_gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                      const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  use_gemm_threads();
  try {
    thread_local MatmulCache cache;
    cache.run(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } catch (const dnnl::error& e) {
    ZEROTH_THROW(Error,
                 "oneDNN bf16 matmul (trans_a={}, trans_b={}, M={}, N={}, K={}, alpha={}, lda={}, ldb={}, beta={}, ldc={}) failed: {}",
                 trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, ldc, e.what());
  }
}
#endif

// The stored rows of a bf16 matrix widened to f32, strides kept.
const float* widened(const uint16_t* x, int64_t rows, int64_t cols, int64_t ld, std::vector<float>& out) {
  out.assign(static_cast<size_t>(rows * ld), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) out[r * ld + j] = bf16_bits_to_f32(x[r * ld + j]);
  return out.data();
}

GemmLibrary choose() {
  if (const auto named = env::get(env::kGemm)) {
    const GemmLibrary library = parse_gemm_library(*named);
    if (!gemm_library_built(library)) {
      ZEROTH_THROW(ConfigError, "{}={}: this build has no oneDNN (configured with ZEROTH_ONEDNN=OFF); unset it or use openblas",
                   env::kGemm, *named);
    }
    return library;
  }
  if (gemm_library_built(GemmLibrary::onednn) && cpu_features().avx2 && cpu_features().fma) return GemmLibrary::onednn;
  return GemmLibrary::openblas;
}

}  // namespace

void sgemm(GemmLibrary library, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  check_arguments("sgemm", trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) return scale_c(m, n, beta, c, ldc);
#if ZEROTH_WITH_ONEDNN
  if (library == GemmLibrary::onednn) return onednn_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  if (library == GemmLibrary::onednn) ZEROTH_THROW(InvalidArgument, "sgemm: this build has no oneDNN (ZEROTH_ONEDNN=OFF)");
#endif
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
              static_cast<int>(ldc));
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  sgemm(gemm_library(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_bf16(GemmLibrary library, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  check_arguments("gemm_bf16", trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) return scale_c(m, n, beta, c, ldc);
#if ZEROTH_WITH_ONEDNN
  // oneDNN 2.6 has bf16 matmuls from AVX-512 on (emulated without AVX512-BF16); below, widen.
  const bool avx512 = (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
  if (library == GemmLibrary::onednn && avx512)
    return onednn_gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
  thread_local std::vector<float> wa, wb;
  const float* fa = widened(a, trans_a ? k : m, trans_a ? m : k, lda, wa);
  const float* fb = widened(b, trans_b ? n : k, trans_b ? k : n, ldb, wb);
  sgemm(library, trans_a, trans_b, m, n, k, alpha, fa, lda, fb, ldb, beta, c, ldc);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
               const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_bf16(gemm_library(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

bool gemm_bf16_native() {
#if ZEROTH_WITH_ONEDNN
  static const bool native = gemm_library() == GemmLibrary::onednn &&
                             (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
  return native;
#else
  return false;
#endif
}

GemmLibrary gemm_library() {
  static const GemmLibrary library = choose();
  return library;
}

bool gemm_library_built(GemmLibrary library) { return library == GemmLibrary::openblas || ZEROTH_WITH_ONEDNN; }

std::string_view gemm_library_name(GemmLibrary library) { return library == GemmLibrary::onednn ? "onednn" : "openblas"; }

GemmLibrary parse_gemm_library(std::string_view name) {
  if (name == "onednn") return GemmLibrary::onednn;
  if (name == "openblas") return GemmLibrary::openblas;
  ZEROTH_THROW(ConfigError, "{}={}: the CPU matrix products' library must be onednn or openblas", env::kGemm, name);
}

std::string gemm_library_summary(GemmLibrary library) {
#if ZEROTH_WITH_ONEDNN
  if (library == GemmLibrary::onednn) {
    const dnnl_version_t* v = dnnl_version();
    return fmt::format("oneDNN {}.{}.{}, {} kernels", v->major, v->minor, v->patch, onednn_isa_name(dnnl_get_effective_cpu_isa()));
  }
#endif
  if (library == GemmLibrary::onednn) return "oneDNN: not in this build (ZEROTH_ONEDNN=OFF)";
  const BlasInfo info = blas_info();
  return fmt::format("OpenBLAS {}, core {}", info.version, info.core);
}

size_t gemm_host_bytes() { return gemm_library() == GemmLibrary::onednn ? size_t{6} << 20 : 0; }

int gemm_threads() {
  const int threads = g_threads.load();
  return threads > 0 ? threads : openblas_get_num_threads();
}

void set_gemm_threads(int threads) {
  ZEROTH_CHECK(threads >= 1, "GEMM thread count must be at least 1, got {}", threads);
  g_threads.store(threads);
  openblas_set_num_threads(threads);
}

GemmRate measure_gemm(int n, int reps, GemmLibrary library, bool bf16) {
  ZEROTH_CHECK(n >= 1 && n <= 16384, "GEMM size {} is out of range 1..16384", n);
  ZEROTH_CHECK(reps >= 1, "GEMM repetitions must be at least 1, got {}", reps);
  const size_t nn = static_cast<size_t>(n) * n;
  // Entries in -3..3 and -2..2: every partial sum is an integer below 6n in magnitude, exact in
  // f32 in any summation order, so the result has one right answer.
  auto a_at = [](size_t i, size_t k) { return static_cast<float>(static_cast<int>((i + 2 * k) % 7) - 3); };
  auto b_at = [](size_t k, size_t j) { return static_cast<float>(static_cast<int>((3 * k + j) % 5) - 2); };
  std::vector<float> a(nn), b(nn), c(nn);
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    for (size_t k = 0; k < static_cast<size_t>(n); ++k) {
      a[i * n + k] = a_at(i, k);
      b[i * n + k] = b_at(i, k);
    }
  }
  std::vector<uint16_t> a16(bf16 ? nn : 0), b16(bf16 ? nn : 0);
  for (size_t i = 0; i < a16.size(); ++i) a16[i] = f32_to_bf16_bits(a[i]), b16[i] = f32_to_bf16_bits(b[i]);
  auto call = [&] {
    if (bf16) gemm_bf16(library, false, false, n, n, n, 1.0f, a16.data(), n, b16.data(), n, 0.0f, c.data(), n);
    else sgemm(library, false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  call();  // page faults, thread start-up
  std::vector<double> seconds;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const int rows = std::min(n, 8);
  for (int r = 0; r < rows; ++r) {
    const size_t i = rows == 1 ? 0 : static_cast<size_t>(r) * (n - 1) / (rows - 1);
    for (size_t j = 0; j < static_cast<size_t>(n); ++j) {
      double want = 0;
      for (size_t k = 0; k < static_cast<size_t>(n); ++k) want += static_cast<double>(a_at(i, k)) * b_at(k, j);
      if (static_cast<double>(c[i * n + j]) != want) {
        ZEROTH_THROW(Error, "{} ({}x{}x{}, {}) computed C[{}][{}] = {} instead of {}: these kernels are wrong on this CPU; {}",
                     bf16 ? "gemm_bf16" : "sgemm", n, n, n, gemm_library_summary(library), i, j, c[i * n + j], want,
                     library == GemmLibrary::onednn ? fmt::format("use OpenBLAS with {}=openblas", env::kGemm)
                                                    : fmt::format("pin another OpenBLAS core with {}", env::kOpenblasCoretype));
      }
    }
  }
  GemmRate rate;
  rate.n = n;
  rate.reps = reps;
  rate.bf16 = bf16;
  rate.seconds = median(seconds);
  rate.gflops = 2.0 * n * n * static_cast<double>(n) / rate.seconds / 1e9;
  return rate;
}

}  // namespace zeroth::cpu
