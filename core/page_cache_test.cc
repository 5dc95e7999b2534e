#include "core/page_cache.h"

#include <atomic>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvarena {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class PageCacheTest : public ::testing::Test {
 protected:
  void Insert(std::vector<int32_t> pages) {
    for (int32_t p : pages) cache_->Insert(p);
  }

  std::vector<int32_t> evicted_;
  std::unique_ptr<PageCache> cache_ = NewLruPageCache([this](int32_t p) { evicted_.push_back(p); });
};

TEST_F(PageCacheTest, EvictsLeastRecentlyInsertedFirst) {
  Insert({7, 3, 9});
  EXPECT_EQ(cache_->size(), 3);
  EXPECT_THAT(cache_->EvictionOrder(), ElementsAre(7, 3, 9));
  EXPECT_EQ(cache_->Evict(), 7);
  EXPECT_EQ(cache_->Evict(), 3);
  EXPECT_THAT(evicted_, ElementsAre(7, 3));
  EXPECT_FALSE(cache_->Lookup(7));
  EXPECT_TRUE(cache_->Lookup(9));
  EXPECT_EQ(cache_->size(), 1);
}

TEST_F(PageCacheTest, EraseTakesAPageOutWithoutEvictingIt) {
  Insert({1, 2, 3});
  cache_->Erase(1);  // adopted again
  EXPECT_FALSE(cache_->Lookup(1));
  EXPECT_THAT(evicted_, IsEmpty());
  cache_->Insert(1);  // released again: now the most recent
  EXPECT_THAT(cache_->EvictionOrder(), ElementsAre(2, 3, 1));
}

TEST_F(PageCacheTest, EvictsAChosenPageThroughTheCallback) {
  Insert({4, 5, 6});
  cache_->Evict(5);
  EXPECT_THAT(evicted_, ElementsAre(5));
  EXPECT_THAT(cache_->EvictionOrder(), ElementsAre(4, 6));
}

// Two caches on one clock are one LRU order: the oldest stamp of both goes first.
TEST(PageCacheClockTest, CachesSharingAClockStampInOneOrder) {
  std::atomic<uint64_t> clock{0};
  auto a = NewLruPageCache([](int32_t) {}, &clock);
  auto b = NewLruPageCache([](int32_t) {}, &clock);
  EXPECT_EQ(a->OldestStamp(), PageCache::kNoStamp);
  a->Insert(1);
  b->Insert(1);
  a->Insert(2);
  EXPECT_LT(a->OldestStamp(), b->OldestStamp());
  a->Evict();  // page 1 of a: now b's page 1 is the oldest of all
  EXPECT_LT(b->OldestStamp(), a->OldestStamp());
  b->Erase(1);
  EXPECT_EQ(b->OldestStamp(), PageCache::kNoStamp);
}

}  // namespace
}  // namespace kvarena
