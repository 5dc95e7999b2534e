// Host-only tests of the launch arithmetic: FastDiv, the split plan and the argument
// checks every launcher goes through. No GPU involved; these run everywhere.
#include "kernels/cuda/attention_plan.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/fast_div.h"
#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/kv_kernels_cuda.h"

namespace kvarena::gpu {
namespace {

TEST(FastDivTest, MatchesIntegerDivisionUpTo2To31) {
  std::mt19937_64 rng(7);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 300; ++d) divisors.push_back(d);
  for (uint32_t d : {511u, 512u, 513u, 4095u, 65536u, 1000003u, 0x7fffffffu}) divisors.push_back(d);
  for (uint32_t d : divisors) {
    const FastDiv div(d);
    auto check = [&](uint32_t n) {
      uint32_t q, r;
      div.DivMod(n, &q, &r);
      ASSERT_EQ(q, n / d) << "n=" << n << " d=" << d;
      ASSERT_EQ(r, n % d) << "n=" << n << " d=" << d;
    };
    for (uint32_t n = 0; n < 5000; ++n) check(n);
    for (uint32_t k = 1; k < 1000 && uint64_t(k) * d < 0x80000000u; ++k) {
      const uint32_t m = k * d;
      check(m - 1);
      check(m);
      if (m + 1 < 0x80000000u) check(m + 1);
    }
    for (int i = 0; i < 2000; ++i) check(uint32_t(rng() % 0x80000000u));
    check(0x7fffffffu);
  }
}

AttentionShape Decode(int batch, int64_t context) {
  AttentionShape s;
  s.batch = batch;
  s.num_kv_heads = 8;
  s.num_q_heads = 32;
  s.n = 1;
  s.head_dim = 128;
  s.max_span = context;
  return s;
}

constexpr int64_t kH200Slots = 132 * 3;

TEST(AttentionPlanTest, LongSingleDecodeSplitsToFillTheDevice) {
  const AttentionPlan p = PlanAttention(Decode(1, 32768), kH200Slots);
  EXPECT_EQ(p.row_blocks, 1);
  EXPECT_GE(p.splits * 8, kH200Slots / 2);
  EXPECT_LE(p.splits * 8, 2 * kH200Slots);
  EXPECT_GT(p.workspace_bytes, 0u);
}

TEST(AttentionPlanTest, SplitsKeepAMinimumOfKeysEach) {
  for (int64_t context : {1, 100, 255, 256, 1000, 4096, 1 << 20}) {
    const AttentionPlan p = PlanAttention(Decode(1, context), 1 << 20);
    EXPECT_LE(p.splits, std::max<int64_t>(1, context / kMinSplitTokens)) << context;
    EXPECT_LE(p.splits, kMaxSplits);
    EXPECT_GE(p.splits, 1);
  }
}

TEST(AttentionPlanTest, BigBatchesSplitLittle) {
  const AttentionPlan p = PlanAttention(Decode(64, 4096), kH200Slots);
  EXPECT_LE(p.splits, 4);
  const AttentionPlan one = PlanAttention(Decode(64, 100), kH200Slots);
  EXPECT_EQ(one.splits, 1);
  EXPECT_EQ(one.workspace_bytes, 0u);
}

TEST(AttentionPlanTest, WorkspaceHoldsEveryPartial) {
  const AttentionShape s = Decode(16, 4096);
  const AttentionPlan p = PlanAttention(s, kH200Slots);
  ASSERT_GT(p.splits, 1);
  const size_t partials = size_t(s.batch) * s.num_q_heads * s.n * p.splits;
  EXPECT_GE(p.acc_offset, p.ml_offset + partials * 8);
  EXPECT_EQ(p.acc_offset % 16, 0u);
  EXPECT_EQ(p.workspace_bytes, p.acc_offset + partials * s.head_dim * 4);
}

TEST(AttentionPlanTest, PrefillRowBlocksCoverEveryRow) {
  AttentionShape s = Decode(2, 500);
  s.n = 37;  // 37 queries x group 4 = 148 rows per kv head
  EXPECT_EQ(PlanAttention(s, kH200Slots).row_blocks, (37 * 4 + kRowsPerCta - 1) / kRowsPerCta);
}

class KernelArgsTest : public ::testing::Test {
 protected:
  static AttentionParams Params(int num_q_heads) {
    AttentionParams p;
    p.num_q_heads = num_q_heads;
    p.n = 1;
    p.q_pos = 10;
    p.scale = 0.125f;
    return p;
  }
  cudaError_t Plan(const PageLayout& l, const AttentionParams& p, int batch = 1) {
    return PlanAttentionRequest(l, p, batch, 100, kH200Slots, &plan_);
  }
  AttentionArgs Args() {
    AttentionArgs a{};
    a.pool = reinterpret_cast<const uint8_t*>(buf_);
    a.tables = reinterpret_cast<const int32_t*>(buf_);
    a.q = buf_;
    a.out = buf_ + 4;
    return a;
  }

  PageLayout layout_{DType::kBFloat16, 16, 8, 128};
  AttentionPlan plan_;
  alignas(16) float buf_[64] = {};
};

TEST_F(KernelArgsTest, PlanRejectsBadShapes) {
  EXPECT_EQ(Plan(layout_, Params(32)), cudaSuccess);
  EXPECT_EQ(Plan(layout_, Params(12)), cudaErrorInvalidValue);  // 12 % 8 != 0
  EXPECT_EQ(Plan(layout_, Params(4)), cudaErrorInvalidValue);   // fewer q than kv heads
  AttentionParams p = Params(32);
  p.window = -1;
  EXPECT_EQ(Plan(layout_, p), cudaErrorInvalidValue);
  p = Params(32);
  p.scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Plan(layout_, p), cudaErrorInvalidValue);
  EXPECT_EQ(Plan(layout_, Params(32), 70000), cudaErrorInvalidValue);
  p = Params(32);
  p.n = int64_t{1} << 61;  // n * group once wrapped past the index bound
  EXPECT_EQ(Plan(layout_, p), cudaErrorInvalidValue);
  PageLayout no_heads = layout_;
  no_heads.num_kv_heads = 0;
  EXPECT_EQ(Plan(no_heads, Params(32)), cudaErrorInvalidValue);
}

TEST_F(KernelArgsTest, PrepareRejectsMisalignedPointersAndShortWorkspace) {
  ASSERT_EQ(Plan(layout_, Params(32)), cudaSuccess);
  bool launch = true;
  AttentionArgs a = Args();
  EXPECT_EQ(PrepareAttention(layout_, Params(32), 1, plan_, nullptr, 0, &a, &launch), cudaSuccess);
  EXPECT_TRUE(launch);
  EXPECT_EQ(a.group, 4);
  EXPECT_EQ(a.token_bytes, 8 * 128 * int64_t(layout_.ElemBytes()));
  EXPECT_EQ(a.page_bytes, 2 * 16 * 8 * 128 * int64_t(layout_.ElemBytes()));
  a = Args();
  a.q = buf_ + 1;
  EXPECT_EQ(PrepareAttention(layout_, Params(32), 1, plan_, nullptr, 0, &a, &launch),
            cudaErrorInvalidValue);
  a = Args();
  a.out = nullptr;
  EXPECT_EQ(PrepareAttention(layout_, Params(32), 1, plan_, nullptr, 0, &a, &launch),
            cudaErrorInvalidValue);

  AttentionPlan split = plan_;
  split.splits = 4;
  split.workspace_bytes = 4096;
  a = Args();
  EXPECT_EQ(PrepareAttention(layout_, Params(32), 1, split, buf_, 4095, &a, &launch),
            cudaErrorInvalidValue);
}

TEST_F(KernelArgsTest, NothingToDoLaunchesNothing) {
  AttentionParams p = Params(32);
  p.n = 0;
  ASSERT_EQ(Plan(layout_, p), cudaSuccess);
  bool launch = true;
  AttentionArgs a{};
  EXPECT_EQ(PrepareAttention(layout_, p, 1, plan_, nullptr, 0, &a, &launch), cudaSuccess);
  EXPECT_FALSE(launch);
}

TEST_F(KernelArgsTest, AppendPicksTheWidestVector) {
  AppendArgs a{};
  a.pool = reinterpret_cast<uint8_t*>(buf_);
  a.tables = reinterpret_cast<const int32_t*>(buf_);
  a.k = a.v = reinterpret_cast<uint8_t*>(buf_);
  int vec = 0;
  dim3 grid;
  bool launch = false;
  ASSERT_EQ(PrepareAppend(layout_, 3, 5, 10, &a, &vec, &grid, &launch), cudaSuccess);
  EXPECT_TRUE(launch);
  EXPECT_EQ(vec, 16);
  EXPECT_EQ(a.row.divisor, 128u * 2 / 16);
  EXPECT_EQ(grid.y, 16u);
  EXPECT_EQ(grid.z, 3u);

  a.k = reinterpret_cast<uint8_t*>(buf_) + 2;  // misaligned input: 2-byte path
  ASSERT_EQ(PrepareAppend(layout_, 1, 5, 10, &a, &vec, &grid, &launch), cudaSuccess);
  EXPECT_EQ(vec, 2);
  EXPECT_EQ(a.row.divisor, 128u);

  PageLayout bad = layout_;
  bad.dtype = DType::kUnspecified;
  EXPECT_EQ(PrepareAppend(bad, 1, 5, 10, &a, &vec, &grid, &launch), cudaErrorInvalidValue);
  EXPECT_EQ(PrepareAppend(layout_, 1, -1, 10, &a, &vec, &grid, &launch), cudaErrorInvalidValue);
  EXPECT_EQ(PrepareAppend(layout_, 1, 5, int64_t{1} << 31, &a, &vec, &grid, &launch),
            cudaErrorInvalidValue);
  // Sums that once wrapped past the bound.
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(PrepareAppend(layout_, 1, 5, kMax64 - 2, &a, &vec, &grid, &launch),
            cudaErrorInvalidValue);
  EXPECT_EQ(PrepareAppend(layout_, 1, kMax64, 10, &a, &vec, &grid, &launch), cudaErrorInvalidValue);
  EXPECT_EQ(PrepareAppend(layout_, 1, 0, 10, &a, &vec, &grid, &launch), cudaSuccess);
  EXPECT_FALSE(launch);
}

// Quantized rows: int8 carries its scales, so an odd head count leaves rows 4-byte
// aligned only and attention copies them in 4-byte halves; fp8 rows are the codes alone.
TEST_F(KernelArgsTest, QuantizedRowsPickTheirLoadWidth) {
  for (auto [format, kv_heads, token_bytes, load] :
       {std::tuple<KvFormat, int, int64_t, int>{KvFormat::kInt8, 1, 132, 4},
        {KvFormat::kInt8, 3, 396, 4},
        {KvFormat::kInt8, 2, 264, 8},
        {KvFormat::kInt8, 8, 1056, 8},
        {KvFormat::kFp8E4M3, 1, 128, 8},
        {KvFormat::kFp8E4M3, 3, 384, 8}}) {
    const PageLayout l{DType::kFloat16, 16, kv_heads, 128, format};
    ASSERT_EQ(Plan(l, Params(kv_heads * 4)), cudaSuccess);
    bool launch = false;
    AttentionArgs a = Args();
    ASSERT_EQ(PrepareAttention(l, Params(kv_heads * 4), 1, plan_, nullptr, 0, &a, &launch),
              cudaSuccess);
    EXPECT_TRUE(launch);
    EXPECT_EQ(a.token_bytes, token_bytes) << KvFormatName(format) << " " << kv_heads;
    EXPECT_EQ(a.page_bytes, 2 * 16 * token_bytes);
    EXPECT_EQ(a.kv_load_bytes, load) << KvFormatName(format) << " " << kv_heads;
    EXPECT_EQ(a.scale_offset, int64_t(kv_heads) * 128);
  }
}

TEST_F(KernelArgsTest, QuantizedAppendTakesAnyHeadDimAndRejectsPlainFormats) {
  AppendArgs a{};
  a.pool = reinterpret_cast<uint8_t*>(buf_);
  a.tables = reinterpret_cast<const int32_t*>(buf_);
  a.k = a.v = reinterpret_cast<uint8_t*>(buf_) + 2;  // any alignment of the activations
  dim3 grid;
  bool launch = false;
  const PageLayout int8{DType::kBFloat16, 16, 3, 36, KvFormat::kInt8};
  ASSERT_EQ(PrepareQuantAppend(int8, 2, 20, 10, &a, &grid, &launch), cudaSuccess);
  EXPECT_TRUE(launch);
  EXPECT_EQ(grid.x, 3u);  // ceil(20 / kQuantRowsPerCta)
  EXPECT_EQ(grid.y, 6u);
  EXPECT_EQ(grid.z, 2u);
  EXPECT_EQ(a.token_bytes, 3 * 36 + 3 * 4);
  EXPECT_EQ(a.value_bytes, 3 * 36);
  EXPECT_EQ(a.head_dim, 36);
  // The plain formats copy (PrepareAppend), and PrepareAppend leaves quantized ones alone.
  int vec = 0;
  EXPECT_EQ(PrepareQuantAppend(layout_, 1, 5, 10, &a, &grid, &launch), cudaErrorInvalidValue);
  EXPECT_EQ(PrepareAppend(int8, 1, 5, 10, &a, &vec, &grid, &launch), cudaErrorInvalidValue);
  EXPECT_EQ(PrepareQuantAppend(int8, 1, 5, int64_t{1} << 31, &a, &grid, &launch),
            cudaErrorInvalidValue);
  EXPECT_EQ(PrepareQuantAppend(int8, 1, 0, 10, &a, &grid, &launch), cudaSuccess);
  EXPECT_FALSE(launch);
}

}  // namespace
// The single-cache launcher's position check runs on the host before any CUDA call, so
// it is testable without a device: q_pos + n once wrapped past it.
TEST(PagedAttentionLauncherTest, RejectsPositionsWhoseSumWraps) {
  PagedKvView view;
  view.layout = PageLayout{DType::kBFloat16, 16, 8, 128};
  AttentionParams p;
  p.num_q_heads = 32;
  p.scale = 0.125f;
  size_t bytes = 0;
  for (auto [pos, n] : {std::pair<int64_t, int64_t>{std::numeric_limits<int64_t>::max(), 1},
                        {std::numeric_limits<int64_t>::max() - 1, 2},
                        {int64_t{1} << 31, 1},
                        {(int64_t{1} << 31) - 1, 1},
                        {0, int64_t{1} << 62}}) {
    p.q_pos = pos;
    p.n = n;
    EXPECT_EQ(PagedAttentionWorkspaceSize(view, p, &bytes), cudaErrorInvalidValue)
        << pos << " + " << n;
    EXPECT_EQ(PagedAttention(view, p, nullptr, nullptr, nullptr, 0), cudaErrorInvalidValue);
  }
}

}  // namespace kvarena::gpu
