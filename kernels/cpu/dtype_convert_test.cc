#include "kernels/cpu/dtype_convert.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/row_convert.h"
#include "tests/support/test_paged_layer.h"
#include "tests/support/test_seed.h"

namespace kvarena::cpu_internal {
namespace {

using kvarena::testing::DecodeStored;

class DTypeConvertTest : public ::testing::Test {
 protected:
  static double Decode(DType dtype, uint16_t bits) {
    return DecodeStored(dtype, reinterpret_cast<const uint8_t*>(&bits));
  }
  // The oracle for float -> half: GCC's _Float16 conversion (round to nearest even).
  static uint16_t HalfOracle(float f) {
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    return bits;
  }
  // The oracle for float -> bfloat16: the nearer of the two bf16 neighbours of f (computed
  // in double), the even one on a tie.
  static uint16_t BFloat16Oracle(float f) {
    const uint16_t down = uint16_t(FloatBits(f) >> 16);  // truncation, toward zero
    const uint16_t up = uint16_t(down + 1);              // next magnitude away from zero
    const double x = std::fabs(double(f));
    const double lo = std::fabs(Decode(DType::kBFloat16, down));
    // Past the largest finite value, rounding goes on as if the exponent were unbounded.
    const double hi =
        (up & 0x7fff) == 0x7f80 ? std::ldexp(1.0, 128) : std::fabs(Decode(DType::kBFloat16, up));
    if (x - lo < hi - x) return down;
    if (x - lo > hi - x) return up;
    return (down & 1) ? up : down;
  }
  // Float inputs that stress rounding: random bit patterns, exact ties, subnormal edges.
  static std::vector<float> Probes(std::mt19937_64& rng) {
    std::vector<float> out = {0.0f,
                              -0.0f,
                              1.0f,
                              65504.0f,
                              65519.9f,
                              65520.0f,
                              1e6f,
                              0x1p-14f,
                              0x1p-24f,
                              0x1p-25f,
                              0x1.8p-25f,
                              0x1p-26f,
                              std::numeric_limits<float>::max(),
                              std::numeric_limits<float>::denorm_min(),
                              std::numeric_limits<float>::infinity()};
    for (uint32_t mant = 0; mant < 64; ++mant) {  // ties and near-ties of the last bits
      out.push_back(BitsFloat(0x3f800000u | (mant << 10) | 0x1000u));
      out.push_back(BitsFloat(0x3f800000u | (mant << 13) | 0x8000u));
    }
    for (int i = 0; i < 200000; ++i) out.push_back(BitsFloat(uint32_t(rng())));
    for (int i = 0; i < 50000; ++i) {  // around the half subnormal range
      out.push_back(
          std::ldexp(std::uniform_real_distribution<float>(0.5f, 1.0f)(rng), -int(rng() % 30)));
    }
    const size_t n = out.size();
    for (size_t i = 0; i < n; ++i) out.push_back(-out[i]);
    return out;
  }
};

TEST_F(DTypeConvertTest, HalfToFloatIsExactForAllBitPatterns) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const double want = Decode(DType::kFloat16, uint16_t(bits));
    const float got = HalfToFloat(uint16_t(bits));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << bits;
    } else {
      EXPECT_EQ(double(got), want) << std::hex << bits;
    }
  }
}

TEST_F(DTypeConvertTest, FloatToHalfRoundsToNearestEven) {
  const uint64_t seed = kvarena::testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  for (float f : Probes(rng)) {
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), HalfOracle(f)) << "f=" << std::hexfloat << f;
  }
}

TEST_F(DTypeConvertTest, BFloat16RoundsToNearestEvenAndWidensExactly) {
  const uint64_t seed = kvarena::testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  for (float f : Probes(rng)) {
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(f))));
      continue;
    }
    if (std::isinf(f)) {
      EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(f)), f);
      continue;
    }
    ASSERT_EQ(FloatToBFloat16(f), BFloat16Oracle(f)) << "f=" << std::hexfloat << f;
  }
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const double want = Decode(DType::kBFloat16, uint16_t(bits));
    if (!std::isnan(want)) {
      EXPECT_EQ(double(BFloat16ToFloat(uint16_t(bits))), want);
    }
  }
}

TEST_F(DTypeConvertTest, RowConversionsRoundTripStoredValues) {
  const uint64_t seed = kvarena::testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<uint8_t> stored = kvarena::testing::RandomStored(dtype, 1000, rng);
    std::vector<float> f(1000);
    LoadAsFloat(dtype, stored.data(), f.size(), f.data());
    std::vector<uint8_t> back(stored.size());
    StoreFromFloat(dtype, f.data(), f.size(), back.data());
    EXPECT_EQ(back, stored);
  }
}

// Each row conversion the CPU has (row_convert.h) gives the scalar conversions' bits: every
// stored bit pattern in, the rounding probes (NaNs with payloads included) out, at every
// tail length, writing nothing past n.
TEST_F(DTypeConvertTest, EveryRowConversionVariantGivesTheScalarBits) {
  const uint64_t seed = kvarena::testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  std::vector<float> probes = Probes(rng);
  for (uint32_t nan : {0x7f800001u, 0x7fbfffffu, 0x7fc00000u, 0x7fe01234u, 0xffc0ffffu}) {
    probes.push_back(BitsFloat(nan));
  }
  std::vector<uint16_t> every(65536);
  for (uint32_t b = 0; b < every.size(); ++b) every[b] = uint16_t(b);
  constexpr uint32_t kPoison = 0xdeadbeefu;
  for (CpuKernels kernels : {CpuKernels::kPortable, CpuKernels::kAvx2}) {
    if (int(kernels) > int(CpuKernelsSupported())) continue;
    SCOPED_TRACE(CpuKernelsName(kernels));
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(DTypeName(dtype));
      TEST_ForceCpuKernels(kernels);
      const RowConvert rows = SelectRowConvert(dtype);
      TEST_ForceCpuKernels(CpuKernels::kAvx512Bf16);
      std::vector<float> got(every.size()), want(every.size());
      rows.load(dtype, every.data(), every.size(), got.data());
      LoadAsFloat(dtype, every.data(), every.size(), want.data());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(FloatBits(got[i]), FloatBits(want[i])) << "stored bits " << std::hex << i;
      }

      std::vector<uint16_t> out(probes.size()), expected(probes.size());
      rows.store(dtype, probes.data(), probes.size(), out.data());
      StoreFromFloat(dtype, probes.data(), probes.size(), expected.data());
      for (size_t i = 0; i < probes.size(); ++i) {
        ASSERT_EQ(out[i], expected[i]) << "float bits " << std::hex << FloatBits(probes[i]);
      }
      for (size_t n = 0; n <= 17; ++n) {  // tails: a poisoned element past n stays poisoned
        SCOPED_TRACE(n);
        std::vector<float> f(n + 1, BitsFloat(kPoison));
        rows.load(dtype, every.data() + 15360, n, f.data());  // 15360: 0x3c00, half 1.0
        LoadAsFloat(dtype, every.data() + 15360, n, want.data());
        EXPECT_EQ(0, std::memcmp(f.data(), want.data(), n * sizeof(float)));
        EXPECT_EQ(FloatBits(f[n]), kPoison);
        std::vector<uint16_t> h(n + 1, uint16_t(kPoison));
        rows.store(dtype, probes.data(), n, h.data());
        EXPECT_TRUE(std::equal(h.begin(), h.begin() + long(n), expected.begin()));
        EXPECT_EQ(h[n], uint16_t(kPoison));
      }
    }
  }
}

}  // namespace
}  // namespace kvarena::cpu_internal
