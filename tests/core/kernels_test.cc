// Element-wise kernels on every device, against float64 references with stated error bounds, on
// sizes that are not multiples of any vector width; and every SIMD level bit-identical to scalar.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "core/cpu/kernels.h"
#include "core/device.h"
#include "core/error_types.h"
#include "tests/test_util.h"

namespace zeroth {
namespace {

using testing::DeviceArray;

const std::vector<size_t> kSizes = {0, 1, 7, 15, 16, 17, 33, 1000, 65536 + 3, 200003};
const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

// Unit roundoff of each type: the bound on one rounding, relative.
double unit_roundoff(DType t) { return t == DType::f32 ? 0x1p-24 : t == DType::bf16 ? 0x1p-8 : 0x1p-11; }
// Absolute error of rounding into the subnormal range: half the smallest subnormal.
double subnormal_floor(DType t) { return t == DType::f32 ? 0x1p-150 : t == DType::bf16 ? 0x1p-134 : 0x1p-25; }

// Values of both signs over a few binades, representable in every type (no f16 overflow).
std::vector<float> random_values(size_t n, uint64_t seed, float scale = 4.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Host storage of values in a dtype (as raw bytes), and back to double.
std::vector<uint8_t> encode(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> bytes(v.size() * dtype_size(t) + 1);
  cpu::cast(v.data(), DType::f32, bytes.data(), t, v.size(), cpu::SimdLevel::scalar);
  return bytes;
}
std::vector<double> decode(const std::vector<uint8_t>& bytes, DType t, size_t n) {
  std::vector<float> f(n);
  cpu::cast(bytes.data(), t, f.data(), DType::f32, n, cpu::SimdLevel::scalar);
  return {f.begin(), f.end()};
}

using Kernels = testing::DeviceTest;

TEST_P(Kernels, FillWritesTheRoundedValueEverywhere) {
  for (DType t : kTypes) {
    for (size_t n : kSizes) {
      DeviceArray a(*device_, std::vector<uint8_t>(n * dtype_size(t) + 1, 0xab), t, n);
      device_->fill(device_->default_stream(), a.view(), 0.1f);
      const auto got = decode(a.download(), t, n);
      const double want = decode(encode({0.1f}, t), t, 1)[0];
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want) << dtype_name(t) << " n " << n << " i " << i;
    }
  }
}

TEST_P(Kernels, CastMatchesTheScalarConversionBitForBit) {
  for (DType src : kTypes) {
    for (DType dst : kTypes) {
      for (size_t n : kSizes) {
        const auto values = random_values(n, n + 17);
        DeviceArray in(*device_, encode(values, src), src, n);
        DeviceArray out(*device_, std::vector<uint8_t>(n * dtype_size(dst) + 1), dst, n);
        device_->cast(device_->default_stream(), out.view(), in.view());
        std::vector<float> widened(n);
        cpu::cast(encode(values, src).data(), src, widened.data(), DType::f32, n, cpu::SimdLevel::scalar);
        const auto want = encode(widened, dst);
        const auto got = out.download();
        ASSERT_EQ(std::vector<uint8_t>(got.begin(), got.begin() + n * dtype_size(dst)),
                  std::vector<uint8_t>(want.begin(), want.begin() + n * dtype_size(dst)))
            << dtype_name(src) << "->" << dtype_name(dst) << " n " << n;
      }
    }
  }
}

// scale: one f32 multiply, then one rounding to the type: |err| <= (u_f32 + u_type) |ref|, plus
// half the smallest subnormal of the type for results that land there.
TEST_P(Kernels, ScaleIsWithinOneRoundingPerStepOfFloat64) {
  for (DType t : kTypes) {
    double worst = 0;
    for (size_t n : kSizes) {
      const auto values = random_values(n, 3 * n + 1);
      DeviceArray x(*device_, encode(values, t), t, n);
      device_->scale(device_->default_stream(), x.view(), 0.3f);
      const auto got = decode(x.download(), t, n);
      const auto in = decode(encode(values, t), t, n);
      for (size_t i = 0; i < n; ++i) {
        const double ref = in[i] * static_cast<double>(0.3f);
        const double err = std::fabs(got[i] - ref);
        worst = std::max(worst, err / std::max(std::fabs(ref), 1e-30));
        ASSERT_LE(err, (0x1p-24 + unit_roundoff(t)) * std::fabs(ref) + subnormal_floor(t))
            << dtype_name(t) << " n " << n << " i " << i;
      }
    }
    std::printf("[scale %s on %s] max relative error %.3g (bound %.3g, plus the subnormal floor)\n",
                std::string(dtype_name(t)).c_str(), GetParam().c_str(), worst, 0x1p-24 + unit_roundoff(t));
  }
}

// axpy: product and sum in f32, then one rounding to y's type:
// |err| <= u_f32 * (|alpha x| + |y + alpha x|) + u_y * |y + alpha x|, plus the subnormal floors.
TEST_P(Kernels, AxpyIsWithinItsRoundingBoundOfFloat64) {
  const float alpha = -0.7f;
  for (DType yt : kTypes) {
    for (DType xt : kTypes) {
      double worst = 0;
      for (size_t n : kSizes) {
        const auto yv = random_values(n, n + 5), xv = random_values(n, n + 6);
        DeviceArray y(*device_, encode(yv, yt), yt, n), x(*device_, encode(xv, xt), xt, n);
        device_->axpy(device_->default_stream(), y.view(), alpha, x.view());
        const auto got = decode(y.download(), yt, n);
        const auto y0 = decode(encode(yv, yt), yt, n), x0 = decode(encode(xv, xt), xt, n);
        for (size_t i = 0; i < n; ++i) {
          const double prod = static_cast<double>(alpha) * x0[i], ref = y0[i] + prod;
          const double bound = 0x1p-24 * (std::fabs(prod) + std::fabs(ref)) + unit_roundoff(yt) * std::fabs(ref) +
                               subnormal_floor(yt) + 0x1p-150;
          const double err = std::fabs(got[i] - ref);
          worst = std::max(worst, err / (std::fabs(prod) + std::fabs(y0[i]) + 1e-30));
          ASSERT_LE(err, bound) << dtype_name(yt) << "+=" << dtype_name(xt) << " n " << n << " i " << i;
        }
      }
      std::printf("[axpy %s += %s on %s] max error relative to |y|+|ax|: %.3g\n", std::string(dtype_name(yt)).c_str(),
                  std::string(dtype_name(xt)).c_str(), GetParam().c_str(), worst);
    }
  }
}

// sum of squares, f32 accumulation: every term is positive, so the relative error is bounded by
// the accumulation depth times u_f32. We hold it to 2e-5, far tighter than that worst case
// (4096 terms per lane: 2.4e-4) and far looser than bf16 accumulation would be (~1e-2).
TEST_P(Kernels, SumOfSquaresIsWithinTwoE5OfFloat64) {
  float* out = nullptr;
  Buffer out_buffer = device_->allocate(sizeof(float), MemTag::other);
  out = out_buffer.as<float>();
  for (DType t : kTypes) {
    for (size_t n : kSizes) {
      const auto values = random_values(n, 7 * n + 3);
      const auto exact = decode(encode(values, t), t, n);
      double ref = 0;
      for (double v : exact) ref += v * v;
      DeviceArray x(*device_, encode(values, t), t, n);
      float result = -1;
      device_->sum_squares(device_->default_stream(), x.view(), out, false);
      device_->copy(device_->default_stream(), &result, out, sizeof(float));
      device_->default_stream().synchronize();
      if (n == 0) {
        EXPECT_EQ(result, 0.0f);
        continue;
      }
      const double rel = std::fabs(result - ref) / ref;
      EXPECT_LE(rel, 2e-5) << dtype_name(t) << " n " << n << ": " << result << " vs " << ref;
      // accumulate: adds to what is there
      device_->sum_squares(device_->default_stream(), x.view(), out, true);
      device_->copy(device_->default_stream(), &result, out, sizeof(float));
      device_->default_stream().synchronize();
      EXPECT_LE(std::fabs(result - 2 * ref) / (2 * ref), 2e-5) << "accumulate, " << dtype_name(t) << " n " << n;
    }
  }
}

TEST_P(Kernels, NonfiniteFlagFindsInfAndNanAnywhere) {
  Buffer flag_buffer = device_->allocate(sizeof(int32_t), MemTag::other);
  auto* flag = flag_buffer.as<int32_t>();
  auto read_flag = [&] {
    int32_t host = -1;
    device_->copy(device_->default_stream(), &host, flag, sizeof host);
    device_->default_stream().synchronize();
    return host;
  };
  const int32_t zero = 0;
  for (DType t : kTypes) {
    for (size_t n : kSizes) {
      if (n == 0) continue;
      for (float bad : {INFINITY, -INFINITY, NAN, 1e6f}) {  // 1e6 overflows f16 to Inf
        for (size_t pos : {size_t{0}, n / 2, n - 1}) {
          auto values = random_values(n, n);
          values[pos] = bad;
          DeviceArray x(*device_, encode(values, t), t, n);
          device_->copy(device_->default_stream(), flag, &zero, sizeof zero);
          device_->flag_nonfinite(device_->default_stream(), x.view(), flag);
          const bool expect = !(bad == 1e6f && t != DType::f16);
          ASSERT_EQ(read_flag(), expect ? 1 : 0) << dtype_name(t) << " n " << n << " pos " << pos << " value " << bad;
        }
      }
      // finite data leaves the flag as it was: flags accumulate across tensors
      DeviceArray clean(*device_, encode(random_values(n, 99), t), t, n);
      const int32_t one = 1;
      device_->copy(device_->default_stream(), flag, &one, sizeof one);
      device_->flag_nonfinite(device_->default_stream(), clean.view(), flag);
      ASSERT_EQ(read_flag(), 1);
      device_->copy(device_->default_stream(), flag, &zero, sizeof zero);
      device_->flag_nonfinite(device_->default_stream(), clean.view(), flag);
      ASSERT_EQ(read_flag(), 0);
    }
  }
}

// reduce: k-1 f32 additions in input order, an optional scale, one rounding to the output type:
// |err| <= (k + 1) u_f32 * sum|in| + u_out |ref|, plus the subnormal floor. max is exact.
TEST_P(Kernels, ReduceOfKInputsIsWithinItsBoundAndMaxIsExact) {
  for (DType it : kTypes) {
    for (DType ot : kTypes) {
      for (int k : {1, 2, 3, 5}) {
        for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{65536 + 3}}) {
          std::vector<std::vector<double>> exact;
          std::vector<DeviceArray> inputs;
          std::vector<TensorView> views;
          for (int p = 0; p < k; ++p) {
            const auto v = random_values(n, 100 * p + n);
            exact.push_back(decode(encode(v, it), it, n));
            inputs.emplace_back(*device_, encode(v, it), it, n);
          }
          for (auto& in : inputs) views.push_back(in.view());
          DeviceArray sum_out(*device_, std::vector<uint8_t>(n * dtype_size(ot) + 1), ot, n);
          DeviceArray max_out(*device_, std::vector<uint8_t>(n * dtype_size(ot) + 1), ot, n);
          const float scale = 1.0f / static_cast<float>(k);
          device_->reduce(device_->default_stream(), sum_out.view(), views, ReduceKind::sum, scale);
          device_->reduce(device_->default_stream(), max_out.view(), views, ReduceKind::max);
          const auto sums = decode(sum_out.download(), ot, n), maxes = decode(max_out.download(), ot, n);
          for (size_t i = 0; i < n; ++i) {
            double ref = 0, mag = 0, mx = -INFINITY;
            for (int p = 0; p < k; ++p) {
              ref += exact[p][i];
              mag += std::fabs(exact[p][i]);
              mx = std::max(mx, exact[p][i]);
            }
            ref *= static_cast<double>(scale);
            const double bound = (k + 1) * 0x1p-24 * mag + unit_roundoff(ot) * std::fabs(ref) + subnormal_floor(ot);
            ASSERT_LE(std::fabs(sums[i] - ref), bound)
                << dtype_name(it) << "->" << dtype_name(ot) << " k " << k << " n " << n << " i " << i;
            ASSERT_EQ(maxes[i], decode(encode({static_cast<float>(mx)}, ot), ot, 1)[0]) << "max, i " << i;
          }
        }
      }
    }
  }
}

TEST_P(Kernels, ReduceMayWriteIntoOneOfItsInputsAndPropagatesNan) {
  const size_t n = 1000;
  auto a = random_values(n, 1), b = random_values(n, 2);
  a[10] = NAN;
  b[20] = NAN;
  DeviceArray da(*device_, encode(a, DType::f32), DType::f32, n), db(*device_, encode(b, DType::f32), DType::f32, n);
  const TensorView views[] = {da.view(), db.view()};
  device_->reduce(device_->default_stream(), db.view(), views, ReduceKind::max);
  const auto got = decode(db.download(), DType::f32, n);
  for (size_t i = 0; i < n; ++i) {
    if (i == 10 || i == 20) {
      ASSERT_TRUE(std::isnan(got[i])) << i;
    } else {
      ASSERT_EQ(got[i], std::max(a[i], b[i])) << i;
    }
  }
}

TEST_P(Kernels, MismatchedShapesAreRejectedBeforeAnythingRuns) {
  Buffer a = device_->allocate(64, MemTag::other), b = device_->allocate(64, MemTag::other);
  EXPECT_THROW(device_->axpy(device_->default_stream(), {a.data(), 16, DType::f32}, 1.0f, {b.data(), 15, DType::f32}),
               InvalidArgument);
  EXPECT_THROW(device_->cast(device_->default_stream(), {a.data(), 16, DType::bf16}, {b.data(), 15, DType::f32}), InvalidArgument);
  auto other = make_device("cpu");
  if (device_->kind() == DeviceKind::cpu) {
    EXPECT_THROW(device_->fill(other->default_stream(), a.view(DType::f32), 0.0f), InvalidArgument);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Kernels, ::testing::ValuesIn(testing::device_specs()), [](const auto& info) { return info.param; });

// Every SIMD level gives the same bits as the scalar one, for every kernel and dtype pair.
TEST(KernelLevels, EveryLevelIsBitIdenticalToScalar) {
  const size_t n = 3 * cpu::kChunkElements + 77;
  const auto a = random_values(n, 1), b = random_values(n, 2);
  for (auto level : cpu::supported_simd_levels()) {
    for (DType yt : kTypes) {
      const auto y_init = encode(a, yt);
      for (DType xt : kTypes) {
        const auto x = encode(b, xt);
        auto y_ref = y_init, y_lvl = y_init;
        cpu::axpy(y_ref.data(), yt, 0.37f, x.data(), xt, n, cpu::SimdLevel::scalar);
        cpu::axpy(y_lvl.data(), yt, 0.37f, x.data(), xt, n, level);
        ASSERT_EQ(y_ref, y_lvl) << "axpy " << cpu::simd_level_name(level);
      }
      auto s_ref = y_init, s_lvl = y_init;
      cpu::scale(s_ref.data(), yt, -1.3f, n, cpu::SimdLevel::scalar);
      cpu::scale(s_lvl.data(), yt, -1.3f, n, level);
      ASSERT_EQ(s_ref, s_lvl) << "scale " << cpu::simd_level_name(level);
      for (int k : {1, 3}) {
        const auto x = encode(b, yt);
        const void* ins[] = {y_init.data(), x.data(), y_init.data()};
        for (DType ot : kTypes) {
          std::vector<uint8_t> r_ref(n * dtype_size(ot)), r_lvl(n * dtype_size(ot));
          for (auto kind : {ReduceKind::sum, ReduceKind::max}) {
            cpu::reduce(ins, k, yt, r_ref.data(), ot, kind, 0.25f, n, cpu::SimdLevel::scalar);
            cpu::reduce(ins, k, yt, r_lvl.data(), ot, kind, 0.25f, n, level);
            ASSERT_EQ(r_ref, r_lvl) << "reduce " << cpu::simd_level_name(level);
          }
        }
      }
      EXPECT_EQ(cpu::sum_squares(y_init.data(), yt, n, cpu::SimdLevel::scalar), cpu::sum_squares(y_init.data(), yt, n, level))
          << "sumsq " << cpu::simd_level_name(level);
    }
  }
}

TEST(KernelLevels, SumOfSquaresDoesNotDependOnThreadCount) {
  const size_t n = 9 * cpu::kChunkElements + 5;
  const auto v = random_values(n, 42);
  const double all = cpu::sum_squares(v.data(), DType::f32, n);
  cpu::set_num_threads(1);
  const double one = cpu::sum_squares(v.data(), DType::f32, n);
  cpu::set_num_threads(std::max(2, static_cast<int>(std::thread::hardware_concurrency())));
  EXPECT_EQ(all, one);
}

// Streamed through pieces that cut chunks anywhere (what offloaded gradients do), the sum is the
// one-call sum to the bit; plain per-piece sums added up are not, which is why the class exists.
TEST(KernelLevels, SegmentedSumOfSquaresIsTheOneCallSumBitForBit) {
  const size_t n = 5 * cpu::kChunkElements + 777;
  const auto v = random_values(n, 7);
  const double whole = cpu::sum_squares(v.data(), DType::f32, n);
  for (size_t piece : {size_t{1000}, size_t{4096}, cpu::kChunkElements - 1, cpu::kChunkElements, 3 * cpu::kChunkElements + 11, n}) {
    cpu::SegmentedSumSquares streamed;
    double per_piece = 0.0;
    for (size_t at = 0; at < n; at += piece) {
      const size_t len = std::min(piece, n - at);
      streamed.add(v.data() + at, len);
      per_piece += cpu::sum_squares(v.data() + at, DType::f32, len);
    }
    EXPECT_EQ(streamed.finish(), whole) << "pieces of " << piece;
    if (piece == 1000) {
      EXPECT_NE(per_piece, whole);
    }
  }
  cpu::SegmentedSumSquares reused;  // finish() starts it afresh
  reused.add(v.data(), 10);
  (void)reused.finish();
  reused.add(v.data(), n);
  EXPECT_EQ(reused.finish(), whole);
}

}  // namespace
}  // namespace zeroth
