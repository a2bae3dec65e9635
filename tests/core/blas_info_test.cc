// The OpenBLAS identity zeroth reports: the core it names is the one OpenBLAS runs (the one
// OPENBLAS_CORETYPE asks for, when set), its kernel width is known, the note about a core below
// the CPU appears exactly when it is below, and the sgemm timing returns exact results at a
// positive rate.
#include "core/cpu/blas_info.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "core/cpu/kernels.h"
#include "core/error.h"

namespace zeroth::cpu {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

TEST(BlasInfo, NamesTheCoreOpenblasRuns) {
  const BlasInfo info = blas_info();
  ASSERT_FALSE(info.core.empty());
  EXPECT_TRUE(info.config.starts_with("OpenBLAS ")) << info.config;
  EXPECT_FALSE(info.version.empty()) << info.config;
  EXPECT_NE(info.config.find(info.version), std::string::npos) << info.config;
  // DYNAMIC_ARCH builds (Debian's) name the core they picked in the build string.
  if (info.config.find("DYNAMIC_ARCH") != std::string::npos) {
    EXPECT_NE(info.config.find(info.core), std::string::npos) << info.config;
  }
  EXPECT_GE(info.threads, 1);
  // A core missing from the table would hide a pin below the CPU: extend the table.
  EXPECT_NE(info.core_isa, VectorIsa::unknown) << info.core;
  EXPECT_NE(info.cpu_isa, VectorIsa::unknown);
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  if (coretype != nullptr && *coretype != '\0') {
    EXPECT_EQ(lower(info.core), lower(coretype)) << "OpenBLAS runs a core other than OPENBLAS_CORETYPE names";
    ASSERT_TRUE(info.coretype.has_value());
    EXPECT_EQ(*info.coretype, coretype);
  } else {
    EXPECT_FALSE(info.coretype.has_value());
  }
  const std::string summary = info.summary();
  EXPECT_NE(summary.find("core " + info.core), std::string::npos) << summary;
  EXPECT_NE(summary.find(std::to_string(info.threads) + " thread"), std::string::npos) << summary;
}

TEST(BlasInfo, CpuIsaFollowsCpuid) {
  const CpuFeatures& f = cpu_features();
  const VectorIsa want = f.avx512f ? VectorIsa::avx512 : f.avx2 && f.fma ? VectorIsa::avx2 : VectorIsa::pre_avx2;
  EXPECT_EQ(blas_info().cpu_isa, want);
}

TEST(BlasInfo, CoreTableIgnoresCase) {
  EXPECT_EQ(blas_core_isa("Haswell"), VectorIsa::avx2);
  EXPECT_EQ(blas_core_isa("HASWELL"), VectorIsa::avx2);
  EXPECT_EQ(blas_core_isa("zen"), VectorIsa::avx2);
  EXPECT_EQ(blas_core_isa("skylakex"), VectorIsa::avx512);
  EXPECT_EQ(blas_core_isa("Cooperlake"), VectorIsa::avx512);
  EXPECT_EQ(blas_core_isa("Prescott"), VectorIsa::pre_avx2);
  EXPECT_EQ(blas_core_isa("Sandybridge"), VectorIsa::pre_avx2);
  EXPECT_EQ(blas_core_isa("Haswel"), VectorIsa::unknown);
  EXPECT_EQ(blas_core_isa(""), VectorIsa::unknown);
}

TEST(BlasInfo, NoteAppearsExactlyWhenTheCoreIsBelowTheCpu) {
  BlasInfo info = blas_info();
  info.cpu_isa = VectorIsa::avx512;
  info.core = "Haswell";
  info.core_isa = VectorIsa::avx2;
  info.coretype = "Haswell";
  ASSERT_TRUE(info.below_cpu());
  std::string note = info.note();
  EXPECT_NE(note.find("OPENBLAS_CORETYPE=Haswell"), std::string::npos) << note;
  EXPECT_NE(note.find("wrong results"), std::string::npos) << note;  // what the pin avoids
  EXPECT_NE(note.find("slower"), std::string::npos) << note;         // what it costs
  EXPECT_NE(info.summary().find("this CPU runs AVX-512"), std::string::npos) << info.summary();

  info.coretype.reset();  // no pin: OpenBLAS fell back by itself
  info.core = "Prescott";
  info.core_isa = VectorIsa::pre_avx2;
  note = info.note();
  EXPECT_NE(note.find("fell back"), std::string::npos) << note;
  EXPECT_NE(note.find("wrong results"), std::string::npos) << note;

  info.core_isa = VectorIsa::avx512;
  EXPECT_FALSE(info.below_cpu());
  EXPECT_EQ(info.note(), "");
  info.core_isa = VectorIsa::unknown;  // no claim about a core zeroth does not know
  EXPECT_FALSE(info.below_cpu());
  EXPECT_EQ(info.note(), "");
}

}  // namespace
}  // namespace zeroth::cpu
