#include "core/page_pool.h"

#include <algorithm>
#include <set>

#include "core/test_util.h"
#include "gtest/gtest.h"

namespace kvarena {
namespace {

// 8 kv heads x 128 dims x f16 x page 16: 64 KiB pages, 32 to a 2 MiB chunk.
constexpr PageLayout kLayout{DType::kFloat16, 16, 8, 128};

class PagePoolTest : public ::testing::Test {
 protected:
  void Make(size_t arena_bytes, int empty_chunks_kept = 1) {
    budget_ = std::make_unique<ArenaBudget>(arena_bytes);
    auto p = PagePool::Create(0, kLayout, backend_.get(), budget_.get(), empty_chunks_kept);
    ASSERT_TRUE(p.ok()) << p.status();
    pool_ = *std::move(p);
  }
  std::vector<int32_t> Take(int64_t n) {
    std::vector<int32_t> ids;
    EXPECT_TRUE(pool_->Allocate(n, &ids).ok());
    return ids;
  }
  size_t Resident() const { return *pool_->region().ResidentBytes(); }

  std::unique_ptr<Backend> backend_ = NewHostBackend();
  std::unique_ptr<ArenaBudget> budget_;
  std::unique_ptr<PagePool> pool_;
};

TEST_F(PagePoolTest, ChunksHoldWholePages) {
  EXPECT_EQ(ChunkBytesFor(64 << 10), kChunkGranularity);
  EXPECT_EQ(ChunkBytesFor(48 << 10), 3 * kChunkGranularity);  // lcm, 128 pages
  EXPECT_EQ(ChunkBytesFor(8 << 20), 8u << 20);
  const size_t odd = 2 * 16 * 3 * 100 * 2;  // 19200: lcm would be 75 granules
  EXPECT_EQ(ChunkBytesFor(odd) % odd, 0u);
  EXPECT_GE(ChunkBytesFor(odd), kChunkGranularity);
  EXPECT_LT(ChunkBytesFor(odd), kChunkGranularity + odd);
}

TEST_F(PagePoolTest, CountsUsedAndFree) {
  Make(8 * kChunkGranularity);
  PoolStats s = pool_->Stats();
  EXPECT_EQ(s.num_pages, 8 * 32);
  EXPECT_EQ(s.pages_used, 0);
  auto ids = Take(40);
  s = pool_->Stats();
  EXPECT_EQ(s.pages_used, 40);
  EXPECT_EQ(s.pages_used + s.pages_free, s.num_pages);
  EXPECT_EQ(s.num_pages, 8 * 32);
  EXPECT_EQ(s.chunks_committed, 2);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()).size(), 40u);
}

TEST_F(PagePoolTest, AllocateFailsWhenFullAndTakesNothing) {
  Make(2 * kChunkGranularity);
  auto ids = Take(60);
  std::vector<int32_t> more;
  EXPECT_THAT(pool_->Allocate(5, &more), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(more.empty());
  EXPECT_EQ(pool_->Stats().pages_used, 60);
  EXPECT_EQ(budget_->used(), 2 * kChunkGranularity);
  EXPECT_TRUE(pool_->Allocate(4, &more).ok());
}

TEST_F(PagePoolTest, FullMessageNamesTheNumbers) {
  Make(kChunkGranularity);
  std::vector<int32_t> ids;
  absl::Status s = pool_->Allocate(33, &ids);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(s.message().find("allocate 33 page(s) of 65536 bytes"), std::string::npos) << s;
  EXPECT_NE(s.message().find("arena_bytes=2097152"), std::string::npos) << s;
}

TEST_F(PagePoolTest, FreedChunksReturnMemoryToTheSystem) {
  Make(size_t{256} << 20);  // 128 chunks, 4096 pages
  auto ids = Take(4096);
  for (int32_t id : ids)
    std::memset(pool_->base() + size_t(id) * kLayout.PageBytes(), 1, kLayout.PageBytes());
  EXPECT_GE(Resident(), size_t{256} << 20);
  pool_->Free(ids);
  // One empty chunk is kept committed (empty_chunks_kept = 1), and it was never punched.
  EXPECT_LE(Resident(), kChunkGranularity);
  EXPECT_EQ(pool_->Stats().chunks_committed, 1);
  EXPECT_EQ(budget_->used(), kChunkGranularity);
}

TEST_F(PagePoolTest, ReusesFreedPagesBeforeCommittingMore) {
  Make(4 * kChunkGranularity, /*empty_chunks_kept=*/4);
  auto a = Take(32);
  pool_->Free(a);
  auto b = Take(32);
  EXPECT_EQ(pool_->Stats().chunks_committed, 1);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
}

TEST_F(PagePoolTest, ReportsWhichPagesAreAllocated) {
  Make(2 * kChunkGranularity);
  auto ids = Take(3);
  EXPECT_TRUE(pool_->TEST_IsAllocated(ids[1]));
  pool_->Free({ids[1]});
  EXPECT_FALSE(pool_->TEST_IsAllocated(ids[1]));
  EXPECT_FALSE(pool_->TEST_IsAllocated(63));  // uncommitted chunk
}

TEST_F(PagePoolTest, TwoPoolsShareOneBudget) {
  Make(3 * kChunkGranularity);
  auto other = PagePool::Create(1, PageLayout{DType::kFloat32, 16, 8, 128}, backend_.get(),
                                budget_.get(), 1);
  ASSERT_TRUE(other.ok());
  Take(64);  // two chunks
  std::vector<int32_t> ids;
  EXPECT_TRUE((*other)->Allocate(16, &ids).ok());  // the third chunk
  EXPECT_THAT((*other)->Allocate(16, &ids), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(pool_->Stats().pages_free, 0);
}

TEST_F(PagePoolTest, RejectsAGeometryBiggerThanTheArena) {
  ArenaBudget small(kChunkGranularity);
  auto p = PagePool::Create(0, PageLayout{DType::kFloat32, 64, 64, 256}, backend_.get(), &small, 1);
  EXPECT_THAT(p, StatusIs(absl::StatusCode::kResourceExhausted));
}

}  // namespace
}  // namespace kvarena
