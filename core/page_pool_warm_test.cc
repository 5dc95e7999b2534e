// Warm chunks (core/page_pool_warm.cc): empty chunks stay committed and resident up to the
// arena's watermark (PoolCounters::warm_limit, StoreOptions::arena_warm_bytes), give way to
// any other use of the budget, keep an idle pool; the pages they hand out again read as
// cleared to their next owner.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "core/page_pool.h"
#include "core/pool_set.h"
#include "core/store_fixture.h"

namespace kvarena {
namespace {

constexpr PageLayout kLayout{DType::kFloat16, 16, 8, 128};  // 64 KiB pages, 32 a chunk
constexpr size_t kChunk = kChunkGranularity;

class WarmChunksTest : public ::testing::Test {
 protected:
  std::unique_ptr<PagePool> Make(uint64_t id, ArenaBudget* budget) {
    auto p =
        PagePool::Create(id, kLayout, backend_.get(), budget, /*empty_chunks_kept=*/1, &counters_);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }
  // Takes n pages of pool and writes every byte of them.
  static std::vector<int32_t> TakeWritten(PagePool& pool, int64_t n) {
    std::vector<int32_t> ids;
    EXPECT_TRUE(pool.Allocate(n, &ids).ok());
    for (int32_t id : ids)
      std::memset(pool.base() + size_t(id) * pool.page_bytes(), 0x5a, pool.page_bytes());
    return ids;
  }

  std::unique_ptr<Backend> backend_ = NewHostBackend();
  PoolCounters counters_;
};

TEST_F(WarmChunksTest, KeepsEmptyChunksUpToTheWatermark) {
  counters_.warm_limit = 4 * kChunk;
  ArenaBudget budget(16 * kChunk);
  auto pool = Make(0, &budget);
  pool->Free(TakeWritten(*pool, 8 * 32));
  EXPECT_EQ(pool->Stats().chunks_committed, 4);
  EXPECT_EQ(pool->empty_bytes(), 4 * kChunk);
  EXPECT_EQ(counters_.warm_bytes.load(), 4 * kChunk);
  EXPECT_EQ(budget.used(), 4 * kChunk);
  EXPECT_GE(*pool->region().ResidentBytes(), 4 * kChunk);  // never punched
  // The next 4 chunks' worth of pages come from them: nothing is committed anew.
  std::vector<int32_t> again;
  ASSERT_TRUE(pool->Allocate(4 * 32, &again).ok());
  EXPECT_EQ(pool->Stats().chunks_committed, 4);
  EXPECT_EQ(counters_.warm_bytes.load(), 0u);
  pool->Free(again);
  EXPECT_EQ(counters_.warm_bytes.load(), 4 * kChunk);
  pool.reset();
  EXPECT_EQ(counters_.warm_bytes.load(), 0u);
  EXPECT_EQ(budget.used(), 0u);
}

TEST_F(WarmChunksTest, WithoutAWatermarkKeepsOneEmptyChunk) {
  ArenaBudget budget(16 * kChunk);
  auto pool = Make(0, &budget);
  pool->Free(TakeWritten(*pool, 8 * 32));
  EXPECT_EQ(pool->Stats().chunks_committed, 1);
  EXPECT_EQ(counters_.warm_bytes.load(), kChunk);
  EXPECT_LE(*pool->region().ResidentBytes(), kChunk);
}

TEST_F(WarmChunksTest, TheWatermarkIsTheArenasNotEachPools) {
  counters_.warm_limit = 4 * kChunk;
  ArenaBudget budget(16 * kChunk);
  auto a = Make(0, &budget);
  auto b = Make(1, &budget);
  a->Free(TakeWritten(*a, 3 * 32));
  b->Free(TakeWritten(*b, 3 * 32));
  EXPECT_EQ(a->empty_bytes(), 3 * kChunk);
  EXPECT_EQ(b->empty_bytes(), kChunk);  // its one of empty_chunks_kept; the rest went back
  EXPECT_EQ(counters_.warm_bytes.load(), 4 * kChunk);
  EXPECT_EQ(budget.used(), 4 * kChunk);
}

TEST_F(WarmChunksTest, PrefaultsTheChunksItCommits) {
  counters_.prefault = true;
  ArenaBudget budget(16 * kChunk);
  auto pool = Make(0, &budget);
  std::vector<int32_t> ids;
  ASSERT_TRUE(pool->Allocate(33, &ids).ok());  // two chunks, nothing written yet
  EXPECT_GE(*pool->region().ResidentBytes(), 2 * kChunk);
  // Prefaulted, not written: every byte still reads as the fresh memfd's zero.
  const uint8_t* p = pool->base() + size_t(ids.back()) * pool->page_bytes();
  EXPECT_EQ(std::count(p, p + pool->page_bytes(), 0), ptrdiff_t(pool->page_bytes()));
}

TEST_F(WarmChunksTest, WarmChunksGiveWayToAnotherPool) {
  counters_.warm_limit = 8 * kChunk;
  ArenaBudget budget(8 * kChunk);
  PoolSet pools(backend_.get(), &budget, /*max_pools=*/4, /*empty_chunks_kept=*/1, &counters_);
  bool created = false;
  auto a = pools.PoolFor(Spec(1, 8, 128, DType::kFloat16, {}, 0, 16), "", &created);
  auto b = pools.PoolFor(Spec(1, 8, 64, DType::kFloat16, {}, 0, 16), "", &created);
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->Free(TakeWritten(**a, 8 * 32));  // the whole arena, warm in a
  EXPECT_EQ(budget.available(), 0u);
  EXPECT_EQ((*a)->empty_bytes(), 8 * kChunk);
  std::vector<int32_t> ids, committed;
  ASSERT_TRUE(pools.Allocate(b->get(), 4 * 64, &ids, &committed).ok());  // 32 KiB pages
  EXPECT_EQ((*a)->empty_bytes(), 4 * kChunk);
  EXPECT_EQ(counters_.warm_bytes.load(), 4 * kChunk);
  // TrimEmpty gives back all it is asked, or nothing.
  EXPECT_FALSE(pools.TrimEmpty(5 * kChunk));
  EXPECT_EQ((*a)->empty_bytes(), 4 * kChunk);
  EXPECT_TRUE(pools.TrimEmpty(3 * kChunk));
  EXPECT_EQ((*a)->empty_bytes(), kChunk);
  (*b)->Free(ids);
}

class WarmStoreTest : public StoreTest {
 protected:
  void MakeWarm(size_t arena_bytes) {
    StoreOptions o = Options(arena_bytes);
    o.arena_warm_bytes = arena_bytes;
    o.arena_prefault = true;
    MakeStore(o);
  }
};

TEST_F(WarmStoreTest, PagesOfAWarmChunkReadAsClearedToTheirNextOwner) {
  MakeWarm(16 * kChunk);
  const std::string a = Alloc(Spec(2, 8, 128));  // f32, page 4: 32 KiB pages
  ASSERT_TRUE(AppendRandom(a, 0, 64).ok());
  ASSERT_TRUE(AppendRandom(a, 1, 64).ok());
  const uint64_t committed = store_->Stats().bytes_committed;
  ASSERT_TRUE(store_->Release("", a).ok());
  ArenaStats s = store_->Stats();
  EXPECT_EQ(s.bytes_committed, committed);  // kept warm
  EXPECT_EQ(s.warm_bytes, committed);
  EXPECT_EQ(s.pools.size(), 1u);  // and the idle pool with them
  const std::string b = Alloc(Spec(2, 8, 128));
  ASSERT_TRUE(store_->Reserve("", {{b, 64}}).ok());
  ASSERT_TRUE(store_->Commit("", {{b, 64}}).ok());
  EXPECT_EQ(store_->Stats().bytes_committed, committed);  // a's pages, again
  for (int l = 0; l < 2; ++l) {
    auto kv = store_->GetKv("", b, l);
    ASSERT_TRUE(kv.ok()) << kv.status();
    ASSERT_FALSE(kv->k.data.empty());
    EXPECT_EQ(kv->k.data, std::string(kv->k.data.size(), '\0')) << "layer " << l;
    EXPECT_EQ(kv->v.data, std::string(kv->v.data.size(), '\0')) << "layer " << l;
  }
}

TEST_F(WarmStoreTest, WarmChunksGiveWayToAScratchRegion) {
  MakeWarm(4 * kChunk);
  const std::string a = Alloc(Spec(1, 8, 128));  // 64 pages a chunk
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(AppendRandom(a, 0, 256).ok());
  ASSERT_TRUE(store_->Release("", a).ok());
  ASSERT_EQ(store_->Stats().bytes_committed, 4 * kChunk);  // the whole arena, warm
  const std::string s = *store_->OpenSession("w");
  absl::StatusOr<std::vector<RegionInfo>> regions = store_->SessionRegions(s);
  ASSERT_TRUE(regions.ok()) << regions.status();
  uint64_t scratch = 0;
  for (const RegionInfo& r : *regions) scratch = r.scratch ? r.region_id : scratch;
  absl::StatusOr<std::vector<SharedPiece>> pieces = store_->ExportRegion(s, scratch);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  for (const SharedPiece& p : *pieces) close(p.fd);
  const ArenaStats st = store_->Stats();
  EXPECT_EQ(st.scratch_bytes, kChunk);
  EXPECT_EQ(st.warm_bytes, 3 * kChunk);
  EXPECT_EQ(st.bytes_committed, 4 * kChunk);
}

TEST_F(WarmStoreTest, StatsSayWhetherPagesAreHuge) {
  MakeWarm(4 * kChunk);
  const ArenaStats s = store_->Stats();
  EXPECT_EQ(s.huge_pages, NewHostBackend()->huge_pages());
  EXPECT_EQ(s.warm_limit, 4 * kChunk);
  EXPECT_EQ(s.warm_bytes, 0u);
}

}  // namespace
}  // namespace kvarena
