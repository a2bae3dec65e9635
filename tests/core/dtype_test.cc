// f32 <-> bf16/f16 conversions: exhaustive round trips, an independent nearest-value reference on
// 10^7 floats plus edge cases, and bit-identical results on every SIMD level this CPU has.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <bit>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu/kernels.h"
#include "core/dtype.h"
#include "core/error_types.h"

namespace zeroth {
namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

struct Format {
  DType type;
  int mant_bits;  // stored mantissa bits
  int bias;       // exponent bias
  int exp_bits;
};
void PrintTo(const Format& f, std::ostream* os) { *os << dtype_name(f.type); }
constexpr Format kBf16{DType::bf16, 7, 127, 8};
constexpr Format kF16{DType::f16, 10, 15, 5};

// Decodes a narrow pattern straight from the format's definition, in double.
double decode(const Format& f, uint16_t h) {
  const int exp = (h >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const int mant = h & ((1 << f.mant_bits) - 1);
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == (1 << f.exp_bits) - 1) return mant ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, 1 - f.bias - f.mant_bits);
  return sign * std::ldexp(mant + (1 << f.mant_bits), exp - f.bias - f.mant_bits);
}

// The reference rounding: nearest representable value by binary search over the sorted finite
// positives; ties go to the even pattern; beyond the largest finite value, the "next" value
// 2^(emax+1) decides between the maximum and Inf.
class NearestReference {
 public:
  explicit NearestReference(const Format& f) : f_(f) {
    const uint16_t inf = static_cast<uint16_t>(((1 << f.exp_bits) - 1) << f.mant_bits);
    for (uint32_t h = 0; h < inf; ++h) values_.push_back(decode(f, static_cast<uint16_t>(h)));
    values_.push_back(std::ldexp(1.0, (1 << (f.exp_bits - 1))));  // the value Inf stands in for
    inf_ = inf;
  }

  uint16_t round(float x) const {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    if (std::isnan(x)) return nan(bits(x));
    const double a = std::fabs(static_cast<double>(x));
    if (std::isinf(x) || a >= values_.back()) return sign | inf_;
    const auto it = std::upper_bound(values_.begin(), values_.end(), a);
    const size_t hi = static_cast<size_t>(it - values_.begin());  // values_[hi-1] <= a < values_[hi]
    const size_t lo = hi - 1;
    const double dlo = a - values_[lo], dhi = values_[hi] - a;
    size_t pick = dlo < dhi ? lo : (dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi));
    return sign | static_cast<uint16_t>(pick == values_.size() - 1 ? inf_ : pick);
  }

  // Sign, all-ones exponent, payload truncated; an empty payload gets the quiet bit.
  uint16_t nan(uint32_t u) const {
    const uint16_t sign = (u >> 16) & 0x8000;
    uint16_t m = static_cast<uint16_t>((u & 0x7fffff) >> (23 - f_.mant_bits));
    if (m == 0) m = static_cast<uint16_t>(1 << (f_.mant_bits - 1));
    return sign | inf_ | m;
  }

 private:
  Format f_;
  std::vector<double> values_;
  uint16_t inf_ = 0;
};

uint16_t scalar_to(DType t, float x) { return t == DType::bf16 ? f32_to_bf16_bits(x) : f32_to_f16_bits(x); }
float scalar_from(DType t, uint16_t h) { return t == DType::bf16 ? bf16_bits_to_f32(h) : f16_bits_to_f32(h); }

class NarrowFormat : public ::testing::TestWithParam<Format> {};

TEST_P(NarrowFormat, EveryPatternRoundTripsThroughF32Exactly) {
  const Format f = GetParam();
  std::vector<uint16_t> all(65536), back(65536);
  std::vector<float> wide(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = scalar_from(f.type, all[h]);
    ASSERT_EQ(scalar_to(f.type, x), all[h]) << "scalar round trip of 0x" << std::hex << h;
    const double expected = decode(f, all[h]);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(x)) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(x), expected) << "decoded value of 0x" << std::hex << h;
    }
  }
  for (auto level : cpu::supported_simd_levels()) {
    cpu::cast(all.data(), f.type, wide.data(), DType::f32, all.size(), level);
    cpu::cast(wide.data(), DType::f32, back.data(), f.type, all.size(), level);
    for (uint32_t h = 0; h < 65536; ++h) {
      ASSERT_EQ(bits(wide[h]), bits(scalar_from(f.type, all[h]))) << cpu::simd_level_name(level) << " widen 0x" << std::hex << h;
      ASSERT_EQ(back[h], all[h]) << cpu::simd_level_name(level) << " round trip 0x" << std::hex << h;
    }
  }
}

std::vector<float> edge_cases() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          INFINITY,
                          -INFINITY,
                          NAN,
                          -NAN,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::lowest(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(),
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          65536.0f,
                          0x1p-14f,
                          0x1p-24f,
                          0x1p-25f,
                          0x1.000002p-25f,
                          0x1.8p-24f,
                          0x1p-26f,
                          0x1.ffcp-15f,
                          from_bits(0x7f800001),
                          from_bits(0xff800001),
                          from_bits(0x7fc00000),
                          from_bits(0x7f810000),
                          from_bits(0x7f802000),
                          from_bits(0x7fbfffff),
                          from_bits(0x3f808000),
                          from_bits(0x3f818000),
                          from_bits(0x3f808001),
                          from_bits(0x7f7fffff),
                          from_bits(0x7f7f8000),
                          from_bits(0x7f7f7fff),
                          from_bits(0x00400000),
                          from_bits(0x00008000),
                          from_bits(0x807fffff)};
  return v;
}

// Random patterns over the whole f32 range, values in and around the narrow range, and exact ties.
std::vector<float> random_floats(size_t n, const Format& f) {
  std::mt19937_64 rng(1234 + static_cast<int>(f.type));
  std::vector<float> v;
  v.reserve(n);
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_real_distribution<double> exponent(-30.0, 18.0);
  NearestReference ref(f);
  while (v.size() < n) {
    switch (v.size() % 3) {
      case 0: v.push_back(from_bits(any(rng))); break;
      case 1: {
        const double x = std::exp2(exponent(rng)) * ((any(rng) & 1) ? -1.0 : 1.0);
        v.push_back(static_cast<float>(x * (f.type == DType::bf16 ? std::exp2((int)(any(rng) % 200) - 100) : 1.0)));
        break;
      }
      default: {  // the midpoint of two neighbouring narrow values (exact in f32)
        const uint16_t h = static_cast<uint16_t>(any(rng) & 0x7bff);
        const double mid = (decode(f, h) + decode(f, static_cast<uint16_t>(h + 1))) / 2;
        if (std::isfinite(mid)) v.push_back(static_cast<float>(mid));
      }
    }
  }
  return v;
}

TEST_P(NarrowFormat, F32ConversionMatchesNearestEvenReferenceOnTenMillionFloats) {
  const Format f = GetParam();
  NearestReference ref(f);
  std::vector<float> input = edge_cases();
  const auto random = random_floats(10'000'000, f);
  input.insert(input.end(), random.begin(), random.end());
  size_t mismatches = 0;
  for (float x : input) {
    const uint16_t want = ref.round(x);
    const uint16_t got = scalar_to(f.type, x);
    if (got != want && ++mismatches <= 5) {
      ADD_FAILURE() << "f32 0x" << std::hex << bits(x) << " (" << x << "): got 0x" << got << ", reference 0x" << want;
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << input.size();

  std::vector<uint16_t> vec(input.size());
  for (auto level : cpu::supported_simd_levels()) {
    cpu::cast(input.data(), DType::f32, vec.data(), f.type, input.size(), level);
    size_t diff = 0;
    for (size_t i = 0; i < input.size(); ++i) diff += vec[i] != scalar_to(f.type, input[i]);
    EXPECT_EQ(diff, 0u) << cpu::simd_level_name(level) << " differs from scalar on " << diff << " of " << input.size();
  }
}

TEST_P(NarrowFormat, VectorPathsHandleEveryAlignmentAndTail) {
  const Format f = GetParam();
  auto input = edge_cases();
  const auto random = random_floats(300, f);
  input.insert(input.end(), random.begin(), random.end());
  std::vector<uint16_t> out(input.size() + 64, 0xdead);
  for (auto level : cpu::supported_simd_levels()) {
    for (size_t offset : {0, 1, 3, 7}) {
      for (size_t n : {0, 1, 15, 16, 17, 31, 33, 100, 339}) {
        n = std::min(n, input.size() - offset);
        std::fill(out.begin(), out.end(), 0xdead);
        cpu::cast(input.data() + offset, DType::f32, out.data() + offset, f.type, n, level);
        for (size_t i = 0; i < out.size(); ++i) {
          const bool inside = i >= offset && i < offset + n;
          ASSERT_EQ(out[i], inside ? scalar_to(f.type, input[i]) : 0xdead)
              << cpu::simd_level_name(level) << " offset " << offset << " n " << n << " index " << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, NarrowFormat, ::testing::Values(kBf16, kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param.type)); });

TEST(DType, NamesParseAndUnknownNamesAreRejected) {
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("fp16"), DType::f16);
  EXPECT_EQ(parse_dtype("float32"), DType::f32);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  try {
    parse_dtype("int8");
    FAIL() << "int8 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'int8'"), std::string::npos) << e.what();
  }
}

TEST(DType, BetweenNarrowTypesRoundsOnce) {
  // f16 -> bf16 goes through f32 exactly, so it is a single rounding of the f16 value.
  NearestReference bf(kBf16);
  std::vector<uint16_t> all(65536), out(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  for (auto level : cpu::supported_simd_levels()) {
    cpu::cast(all.data(), DType::f16, out.data(), DType::bf16, all.size(), level);
    for (uint32_t h = 0; h < 65536; ++h) {
      ASSERT_EQ(out[h], bf.round(f16_bits_to_f32(static_cast<uint16_t>(h)))) << std::hex << h;
    }
  }
}

}  // namespace
}  // namespace zeroth
