// The host store (tiers/host_store.h): an LRU by bytes in memory that hands what it drops
// to the caller.
#include "tiers/host_store.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_seed.h"
#include "tiers/store_test_util.h"

namespace kvarena {
namespace {

using ::kvarena::testing::IsOk;
using ::kvarena::testing::IsOkAndHolds;
using ::kvarena::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class HostStoreTest : public ::testing::Test {
 protected:
  // Puts key i with a value of `bytes` bytes; the keys of what it evicted, checking that
  // each evicted value is the one Put under its key.
  std::vector<int> Put(int i, size_t bytes, int version = 0) {
    std::vector<EvictedChunk> evicted;
    EXPECT_THAT(store_->Put(TestKey(i), TestValue(i, bytes, version), &evicted), IsOk());
    std::vector<int> keys;
    for (const EvictedChunk& e : evicted) {
      keys.push_back(int(e.key.low) - 1);
      const auto [size, put_version] = put_[keys.back()];
      EXPECT_EQ(e.value, TestValue(keys.back(), size, put_version)) << "key " << keys.back();
    }
    put_[i] = {bytes, version};
    return keys;
  }
  absl::StatusOr<std::string> Get(int i) { return store_->Get(TestKey(i), absl::InfiniteFuture()); }

  std::unique_ptr<TierStore> store_ = NewHostStore(300);
  std::map<int, std::pair<size_t, int>> put_;  // key: the size and version Put last
};

TEST_F(HostStoreTest, ReturnsWhatWasPutAndCountsIt) {
  EXPECT_EQ(store_->medium(), "host");
  EXPECT_THAT(Get(1), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(store_->Contains(TestKey(1)));
  EXPECT_THAT(Put(1, 100), IsEmpty());
  EXPECT_THAT(Put(2, 50), IsEmpty());
  EXPECT_THAT(Get(1), IsOkAndHolds(TestValue(1, 100)));
  EXPECT_TRUE(store_->Contains(TestKey(2)));
  const TierUsage u = store_->Usage();
  EXPECT_EQ(u.bytes_used, 150u);
  EXPECT_EQ(u.bytes_limit, 300u);
  EXPECT_EQ(u.chunks, 2);
  EXPECT_TRUE(u.up);
}

TEST_F(HostStoreTest, PutEvictsTheLeastRecentlyUsedAndHandsThemOn) {
  Put(1, 100);
  Put(2, 100);
  Put(3, 100);
  ASSERT_THAT(Get(1), IsOk());  // 1 is now the most recent: 2, 3, 1
  EXPECT_THAT(Put(4, 100), ElementsAre(2));
  EXPECT_FALSE(store_->Contains(TestKey(2)));
  // 3, 1, 4: a value of 250 needs all three out, least recent first.
  EXPECT_THAT(Put(5, 250), ElementsAre(3, 1, 4));
  EXPECT_EQ(store_->Usage().bytes_used, 250u);
  EXPECT_EQ(store_->Usage().chunks, 1);
}

TEST_F(HostStoreTest, ContainsDoesNotRefreshRecency) {
  Put(1, 100);
  Put(2, 100);
  Put(3, 100);
  EXPECT_TRUE(store_->Contains(TestKey(1)));
  EXPECT_THAT(Put(4, 100), ElementsAre(1));
}

TEST_F(HostStoreTest, EvictionByBytesDropsOnlyWhatIsNeeded) {
  Put(1, 200);
  Put(2, 50);
  Put(3, 50);
  EXPECT_THAT(Put(4, 150), ElementsAre(1));  // 1 alone frees enough
  EXPECT_EQ(store_->Usage().bytes_used, 250u);
  EXPECT_THAT(Put(5, 50), IsEmpty());  // exactly at the limit
  EXPECT_EQ(store_->Usage().bytes_used, 300u);
}

TEST_F(HostStoreTest, PutReplacesAKeysValue) {
  Put(1, 100);
  Put(2, 100);
  Put(3, 100);
  // The old value of 1 is replaced, not handed on; 2 makes room for the rest.
  EXPECT_THAT(Put(1, 150, /*version=*/1), ElementsAre(2));
  EXPECT_THAT(Get(1), IsOkAndHolds(TestValue(1, 150, 1)));
  EXPECT_EQ(store_->Usage().bytes_used, 250u);
  EXPECT_EQ(store_->Usage().chunks, 2);
}

TEST_F(HostStoreTest, AValueBiggerThanTheLimitIsRefusedAndChangesNothing) {
  Put(1, 100);
  std::vector<EvictedChunk> evicted;
  EXPECT_THAT(store_->Put(TestKey(1), std::string(301, 'x'), &evicted),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("301 bytes exceeds the limit of 300")));
  EXPECT_THAT(evicted, IsEmpty());
  EXPECT_THAT(Get(1), IsOkAndHolds(TestValue(1, 100)));
  EXPECT_THAT(NewHostStore(0)->Put(TestKey(1), "a", nullptr),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST_F(HostStoreTest, EraseDropsAKey) {
  Put(1, 100);
  Put(2, 100);
  store_->Erase(TestKey(1));
  store_->Erase(TestKey(9));  // absent: nothing happens
  EXPECT_FALSE(store_->Contains(TestKey(1)));
  EXPECT_THAT(Get(1), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(store_->Usage().bytes_used, 100u);
  EXPECT_EQ(store_->Usage().chunks, 1);
}

TEST_F(HostStoreTest, EvictedMayBeNull) {
  Put(1, 200);
  EXPECT_THAT(store_->Put(TestKey(2), TestValue(2, 200), nullptr), IsOk());
  EXPECT_FALSE(store_->Contains(TestKey(1)));
}

TEST_F(HostStoreTest, ConcurrentGetsAndPutsSeeOnlyWholeValues) {
  store_ = NewHostStore(4000);  // about a third of the 64 stress values
  RunConcurrentStress(store_.get(), ::kvarena::testing::TestSeed());
}

}  // namespace
}  // namespace kvarena
