// RedisStore while a slot migrates between primaries (CLUSTER SETSLOT IMPORTING /
// MIGRATING, MIGRATE, SETSLOT NODE): ASK answered mid-migration, MOVED after it, every
// answer correct.
#include <vector>

#include "gmock/gmock.h"
#include "tests/redis/redis_fixture.h"
#include "tests/support/status_matchers.h"

namespace kvarena::testing {
namespace {

TEST_F(RedisStoreTest, SlotMigrationIsFollowedThroughAskAndMoved) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ClusterOf(3, 0)));
  std::unique_ptr<RedisStore> store = NewStore(StoreOptions());
  ASSERT_NE(store, nullptr);
  // Six chunk keys in the slot of Key(0).
  const int slot = RedisKeySlot(store->RedisKey(Key(0)));
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; ids.size() < 6; ++i) {
    if (RedisKeySlot(store->RedisKey(Key(i))) == slot) ids.push_back(i);
  }
  for (int i = 0; i < 4; ++i) ASSERT_THAT(store->Put(Key(ids[i]), Value(ids[i]), nullptr), IsOk());
  const int source = PortOf(*store, Key(ids[0]));
  absl::StatusOr<std::vector<int>> primaries = cluster_->Primaries();
  ASSERT_TRUE(primaries.ok()) << primaries.status();
  const int target = (*primaries)[0] != source ? (*primaries)[0] : (*primaries)[1];
  absl::StatusOr<std::string> source_id = cluster_->NodeId(source);
  absl::StatusOr<std::string> target_id = cluster_->NodeId(target);
  ASSERT_TRUE(source_id.ok() && target_id.ok());
  const std::string s = std::to_string(slot);
  auto cli = [&](int port, const std::vector<std::string>& args) {
    absl::StatusOr<std::string> out = cluster_->Cli(port, args);
    ASSERT_TRUE(out.ok()) << out.status();
  };
  auto migrate = [&](std::vector<uint64_t> which) {
    std::vector<std::string> args = {"MIGRATE", "127.0.0.1", std::to_string(target), "", "0",
                                     "5000",    "KEYS"};
    for (uint64_t id : which) args.push_back(store->RedisKey(Key(id)));
    cli(source, args);
  };
  auto expect_all = [&](size_t n) {
    for (size_t i = 0; i < n; ++i) {
      SCOPED_TRACE(i);
      EXPECT_EQ(store->Get(Key(ids[i]), Deadline()).value_or("<error>"), Value(ids[i]));
    }
  };

  cli(target, {"CLUSTER", "SETSLOT", s, "IMPORTING", *source_id});
  cli(source, {"CLUSTER", "SETSLOT", s, "MIGRATING", *target_id});
  migrate({ids[0], ids[1]});
  // Mid-migration: moved keys are answered by the target after ASK + ASKING, the others by
  // the source; a new chunk is written to the target the same way.
  expect_all(4);
  ASSERT_THAT(store->Put(Key(ids[4]), Value(ids[4]), nullptr), IsOk());
  ASSERT_THAT(store->Put(Key(ids[5]), Value(ids[5]), nullptr), IsOk());
  expect_all(6);
  const RedisCounterValues mid = store->cluster_counters();
  EXPECT_GE(mid.ask, 3);
  EXPECT_EQ(mid.moved, 0);

  migrate({ids[2], ids[3]});
  for (int port : *primaries) cli(port, {"CLUSTER", "SETSLOT", s, "NODE", *target_id});
  expect_all(6);
  const RedisCounterValues after = store->cluster_counters();
  EXPECT_GE(after.moved, 1);
  EXPECT_EQ(after.errors, 0);
  EXPECT_EQ(PortOf(*store, Key(ids[0])), target) << "the MOVED updated the slot map";
  EXPECT_TRUE(store->Contains(Key(ids[5])));
}

}  // namespace
}  // namespace kvarena::testing
