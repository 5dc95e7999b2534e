#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/kv_kernels.h"
#include "kernels/kv_kernels.h"
#include "tests/support/test_paged_layer.h"
#include "tests/support/test_seed.h"

namespace kvarena {
namespace {

using kvarena::testing::RandomStored;
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
        size_t(view.layout.num_kv_heads) * n * view.layout.head_dim * view.layout.ElemBytes();
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
