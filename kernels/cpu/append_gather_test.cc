#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/kv_kernels.h"
#include "kernels/kv_kernels.h"
#include "kernels/kv_quant.h"
#include "tests/support/test_paged_layer.h"
#include "tests/support/test_seed.h"

namespace kvarena {
namespace {

using kvarena::testing::DecodeStored;
using kvarena::testing::DecodeValues;
using kvarena::testing::RandomStored;
using kvarena::testing::RoundTo;
using kvarena::testing::TestPagedLayer;

class AppendGatherTest : public ::testing::Test {
 protected:
  AppendGatherTest() : seed_(kvarena::testing::TestSeed()), rng_(seed_) {}

  static PageLayout Layout(DType dtype, int page_size, int heads, int dim) {
    PageLayout layout;
    layout.dtype = dtype;
    layout.page_size = page_size;
    layout.num_kv_heads = heads;
    layout.head_dim = dim;
    return layout;
  }
  // Random [heads][n][dim] tensor of stored values.
  std::vector<uint8_t> Tensor(const PageLayout& layout, int64_t n) {
    return RandomStored(layout.dtype, size_t(layout.num_kv_heads) * n * layout.head_dim, rng_);
  }
  // What GatherKv reads for positions [pos, pos + n), into buffers pre-filled with junk.
  std::pair<std::vector<uint8_t>, std::vector<uint8_t>> Gather(const PagedKvView& view, int64_t pos,
                                                               int64_t n) {
    const size_t bytes =
        size_t(view.layout.num_kv_heads) * n * view.layout.head_dim * view.layout.ActivationBytes();
    std::vector<uint8_t> k(bytes, 0xAB), v(bytes, 0xCD);
    GatherKv(view, pos, n, k.data(), v.data());
    return {k, v};
  }

  uint64_t seed_;
  std::mt19937_64 rng_;
};

TEST_F(AppendGatherTest, RoundTripsBitExactInRandomChunks) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int page_size : {1, 8, 16, 32}) {
      SCOPED_TRACE(::testing::Message() << "seed=" << seed_ << " dtype=" << DTypeName(dtype)
                                        << " page_size=" << page_size);
      const PageLayout layout = Layout(dtype, page_size, 3, 64);
      const int64_t first_block = int64_t(rng_() % 3);
      const int64_t start = first_block * page_size;
      const int64_t len = start + 1 + int64_t(rng_() % 100);
      TestPagedLayer layer(layout, first_block, len, rng_);
      const std::vector<uint8_t> pool_before = layer.pool_bytes();

      const int64_t n = len - start;
      const std::vector<uint8_t> k = Tensor(layout, n), v = Tensor(layout, n);
      const size_t row = size_t(layout.head_dim) * layout.ElemBytes();
      for (int64_t pos = start; pos < len;) {  // appends of random sizes, as a model would
        const int64_t chunk = std::min<int64_t>(len - pos, 1 + int64_t(rng_() % 20));
        std::vector<uint8_t> kc, vc;  // [heads][chunk][dim] slices of k and v
        for (int h = 0; h < layout.num_kv_heads; ++h) {
          const size_t off = (size_t(h) * n + (pos - start)) * row;
          kc.insert(kc.end(), k.begin() + off, k.begin() + off + chunk * row);
          vc.insert(vc.end(), v.begin() + off, v.begin() + off + chunk * row);
        }
        AppendKv(layer.view(), pos, chunk, kc.data(), vc.data());
        pos += chunk;
      }
      const auto [k_back, v_back] = Gather(layer.view(), start, n);
      EXPECT_EQ(k_back, k);
      EXPECT_EQ(v_back, v);

      // Only the slots of [start, len) in the table's pages changed.
      size_t changed = 0;
      for (size_t i = 0; i < pool_before.size(); ++i)
        changed += pool_before[i] != layer.pool_bytes()[i];
      EXPECT_LE(changed, 2 * size_t(n) * layout.TokenBytes());
    }
  }
}

// int8 (kernels/kv_quant.h): each (token, head) row gets the scale max|x| / 127 and codes
// within half a step of x; GatherKv gives code x scale in the activation dtype. A row of
// zeros and a row holding the dtype's largest finite value are among the rows.
TEST_F(AppendGatherTest, Int8QuantizesEachTokenAndHeadAndGathersItDequantized) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(::testing::Message() << "seed=" << seed_ << " dtype=" << DTypeName(dtype));
    PageLayout layout = Layout(dtype, 8, 3, 64);
    layout.kv_format = KvFormat::kInt8;
    ASSERT_EQ(layout.TokenBytes(), 3u * 64 + 3 * 4);
    const int64_t len = 2 + int64_t(rng_() % 60);
    TestPagedLayer layer(layout, 0, len, rng_);
    std::vector<uint8_t> k = Tensor(layout, len), v = Tensor(layout, len);
    const size_t elem = layout.ActivationBytes(), row = size_t(layout.head_dim) * elem;
    std::fill(k.begin(), k.begin() + row, 0);  // K of token 0, head 0: all zeros
    const double largest = dtype == DType::kFloat16    ? 65504.0
                           : dtype == DType::kBFloat16 ? 0x1.fep127
                                                       : 0x1.fffffep127;
    const std::string largest_bytes = testing::EncodeValues({-largest}, dtype);
    std::memcpy(v.data() + row * len + 5 * elem, largest_bytes.data(), elem);  // V, head 1, token 0
    AppendKv(layer.view(), 0, len, k.data(), v.data());
    const auto [k_back, v_back] = Gather(layer.view(), 0, len);
    size_t checked = 0;
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<uint8_t>& in = kv == 0 ? k : v;
      const std::vector<uint8_t>& back = kv == 0 ? k_back : v_back;
      for (int h = 0; h < layout.num_kv_heads; ++h) {
        for (int64_t t = 0; t < len; ++t) {
          const size_t at = (size_t(h) * len + t) * row;
          const std::vector<double> x = DecodeValues(dtype, in.data() + at, layout.head_dim);
          double amax = 0;
          for (double e : x) amax = std::max(amax, std::fabs(e));
          const float scale = layer.Scale(kv, t, h);
          ASSERT_EQ(scale, float(amax) / 127.0f) << "kv " << kv << " head " << h << " t " << t;
          for (int d = 0; d < layout.head_dim; ++d) {
            const int code = int8_t(*layer.At(kv, t, h, d));
            ASSERT_GE(code, -127);
            // Half a step, plus x / scale's float32 rounding (|x / scale| <= 127).
            ASSERT_LE(std::fabs(double(code) * scale - x[d]), (0.5 + 127 * 0x1p-24) * scale)
                << "kv " << kv << " head " << h << " t " << t << " d " << d;
            const double got = DecodeStored(dtype, back.data() + at + size_t(d) * elem);
            ASSERT_EQ(got, RoundTo(double(float(code) * scale), dtype));
            ++checked;
          }
        }
      }
    }
    EXPECT_EQ(checked, 2 * size_t(len) * 3 * 64);
  }
}

// Every finite fp8 e4m3 value, ascending with its code (the test decoder's, not the kernels').
std::vector<std::pair<double, uint8_t>> Fp8Values() {
  std::vector<std::pair<double, uint8_t>> all;
  for (int c = 0; c < 256; ++c) {
    const double x = kvarena::testing::Fp8E4M3Value(uint8_t(c));
    if (!std::isnan(x)) all.emplace_back(x, uint8_t(c));
  }
  std::sort(all.begin(), all.end());
  return all;
}

// The codes of the finite values nearest x (two at a tie; +0 and -0 both for 0), x clamped
// to [-448, 448] first as the format saturates.
std::vector<uint8_t> NearestFp8(double x) {
  static const std::vector<std::pair<double, uint8_t>> all = Fp8Values();
  x = std::clamp(x, -448.0, 448.0);
  double best = INFINITY;
  for (const auto& [value, code] : all) best = std::min(best, std::fabs(value - x));
  std::vector<uint8_t> codes;
  for (const auto& [value, code] : all) {
    if (std::fabs(value - x) == best) codes.push_back(code);
  }
  return codes;
}

// Of the nearest codes, the one round-to-nearest-even picks: even mantissa; the sign of x.
uint8_t WantFp8(double x, bool negative) {
  std::vector<uint8_t> codes = NearestFp8(x);
  if (codes.size() > 1) {
    std::erase_if(codes, [&](uint8_t c) {
      const double v = kvarena::testing::Fp8E4M3Value(c);
      return v == 0 ? ((c & 0x80) != 0) != negative : (c & 1) != 0;
    });
  }
  return codes.empty() ? 0xFF : codes.front();
}

// fp8 e4m3 (kernels/kv_quant.h): the decoder gives every code the format's value, and the
// encoder picks the nearest value, ties to even, saturating at +-448 and keeping NaN.
TEST(Fp8E4M3Test, EveryCodeDecodesAndEncodesToTheNearestValue) {
  for (int c = 0; c < 256; ++c) {
    SCOPED_TRACE(::testing::Message() << "code 0x" << std::hex << c);
    const double want = kvarena::testing::Fp8E4M3Value(uint8_t(c));
    const float got = DecodeFp8E4M3(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got));
      EXPECT_TRUE(std::isnan(DecodeFp8E4M3(EncodeFp8E4M3(got))));
      continue;
    }
    EXPECT_EQ(double(got), want);
    EXPECT_EQ(EncodeFp8E4M3(got), uint8_t(c));
  }
  const uint64_t seed = kvarena::testing::TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::uniform_real_distribution<double> exponent(-12, 10);
  const std::vector<std::pair<double, uint8_t>> all = Fp8Values();
  std::vector<float> xs;
  for (int i = 0; i < 20000; ++i) {
    xs.push_back(float((rng() & 1 ? -1 : 1) * std::exp2(exponent(rng))));
  }
  for (size_t i = 0; i + 1 < all.size(); ++i) {  // every midpoint: a tie
    xs.push_back(float((all[i].first + all[i + 1].first) / 2));
  }
  for (float x : {0.0f, -0.0f, 448.0f, 464.0f, 465.0f, 1e30f, -1e30f, INFINITY, -INFINITY, 0x1p-10f,
                  0x1p-9f, 0x1.8p-10f, 0x1p-149f, 3.4028235e38f}) {
    xs.push_back(x);
  }
  for (float x : xs) {
    ASSERT_EQ(int(EncodeFp8E4M3(x)), int(WantFp8(double(x), std::signbit(x)))) << "x=" << x;
  }
  EXPECT_TRUE(std::isnan(DecodeFp8E4M3(EncodeFp8E4M3(NAN))));
  EXPECT_EQ(EncodeFp8E4M3(INFINITY), 0x7E);
  EXPECT_EQ(EncodeFp8E4M3(-INFINITY), 0xFE);
}

// fp8 through AppendKv and GatherKv: each value stored as the code nearest x / scale of its
// head's static scale, read back as value(code) x scale in the activation dtype.
TEST_F(AppendGatherTest, Fp8StoresNearestCodesOfStaticallyScaledValues) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(::testing::Message() << "seed=" << seed_ << " dtype=" << DTypeName(dtype));
    PageLayout layout = Layout(dtype, 8, 3, 64);
    layout.kv_format = KvFormat::kFp8E4M3;
    ASSERT_EQ(layout.TokenBytes(), 3u * 64);
    const int64_t len = 2 + int64_t(rng_() % 60);
    TestPagedLayer layer(layout, 0, len, rng_);
    // Scales that put [-1, 1] across the format's range: most values normal, some
    // subnormal, none saturated (1 / 2^-8 = 256 < 448).
    layer.SetStaticScales({0x1p-8f, 0.01f, 1.0f}, {0.5f, 0x1p-5f, 3.0f});
    std::vector<uint8_t> k = Tensor(layout, len), v = Tensor(layout, len);
    AppendKv(layer.view(), 0, len, k.data(), v.data());
    const auto [k_back, v_back] = Gather(layer.view(), 0, len);
    const size_t elem = layout.ActivationBytes(), row = size_t(layout.head_dim) * elem;
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<uint8_t>& in = kv == 0 ? k : v;
      const std::vector<uint8_t>& back = kv == 0 ? k_back : v_back;
      for (int h = 0; h < layout.num_kv_heads; ++h) {
        const float scale = layer.view().StaticScale(kv, h);
        for (int64_t t = 0; t < len; ++t) {
          const size_t at = (size_t(h) * len + t) * row;
          const std::vector<double> x = DecodeValues(dtype, in.data() + at, layout.head_dim);
          for (int d = 0; d < layout.head_dim; ++d) {
            const uint8_t code = *layer.At(kv, t, h, d);
            const float scaled = float(x[d]) / scale;  // the format's x / scale, in float32
            ASSERT_EQ(int(code), int(WantFp8(scaled, std::signbit(scaled))))
                << "kv " << kv << " head " << h << " t " << t << " d " << d << " x " << x[d];
            const double got = DecodeStored(dtype, back.data() + at + size_t(d) * elem);
            ASSERT_EQ(got,
                      RoundTo(double(float(kvarena::testing::Fp8E4M3Value(code)) * scale), dtype));
          }
        }
      }
    }
  }
}

TEST_F(AppendGatherTest, GatherReadsASubRangeAtItsPositions) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  const PageLayout layout = Layout(DType::kBFloat16, 8, 2, 128);
  TestPagedLayer layer(layout, 2, 70, rng_);
  layer.FillRandom(rng_);
  const int64_t pos = 21, n = 30;
  const auto [k, v] = Gather(layer.view(), pos, n);
  const size_t row = size_t(layout.head_dim) * layout.ElemBytes();
  for (int h = 0; h < layout.num_kv_heads; ++h) {
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(std::equal(k.begin() + (h * n + i) * row, k.begin() + (h * n + i + 1) * row,
                             layer.At(0, pos + i, h, 0)));
      ASSERT_TRUE(std::equal(v.begin() + (h * n + i) * row, v.begin() + (h * n + i + 1) * row,
                             layer.At(1, pos + i, h, 0)));
    }
  }
}

TEST_F(AppendGatherTest, CopyPagesCopiesTheKeptSlotsAndZeroesTheRest) {
  const PageLayout layout = Layout(DType::kFloat16, 4, 2, 8);
  const size_t page = layout.PageBytes(), half = page / 2, token = layout.TokenBytes();
  std::vector<uint8_t> pool = RandomStored(DType::kFloat16, 4 * page / 2, rng_);
  const std::vector<uint8_t> before = pool;
  std::unique_ptr<KvKernels> k = NewCpuKvKernels(0);
  const PageCopy copies[] = {{0, 2, 3}, {1, 3, 0}};
  ASSERT_TRUE(k->CopyPages(layout, pool.data(), copies, 2).ok());
  EXPECT_TRUE(
      std::equal(pool.begin(), pool.begin() + 2 * page, before.begin()));  // sources untouched
  for (size_t part : {size_t{0}, half}) {
    const uint8_t* dst = pool.data() + 2 * page + part;
    EXPECT_TRUE(std::equal(dst, dst + 3 * token, before.data() + part));
    EXPECT_TRUE(std::all_of(dst + 3 * token, dst + half, [](uint8_t b) { return b == 0; }));
    const uint8_t* empty = pool.data() + 3 * page + part;
    EXPECT_TRUE(std::all_of(empty, empty + half, [](uint8_t b) { return b == 0; }));
  }
}

}  // namespace
}  // namespace kvarena
