// RedisStore while a Redis Cluster fails: a primary SIGKILLed (its replica takes over; a
// store that only reads relearns who owns its slots) and a primary SIGSTOPped (the circuit
// breaker stops the waiting). Nothing asserts on the wall clock beyond "returned by the
// deadline plus a generous margin". Where a test holds a breaker open, the store reads a
// FakeClock, so the breaker stays open however slowly the machine runs, and closes when
// the test advances it.
#include <signal.h>

#include <iostream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "tests/redis/redis_fixture.h"
#include "tests/support/status_matchers.h"

namespace kvarena::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kDeadline = absl::Seconds(2);  // above command_timeout (1 s)
constexpr absl::Duration kMargin = absl::Seconds(3);    // a loaded 2-core machine

// The primary a failure test hits and the chunks on it.
struct Victim {
  int port = 0;
  std::vector<uint64_t> keys;    // on the victim
  std::vector<uint64_t> others;  // on the other primaries
};

// Takes the `which`-th primary as the victim and puts keys 0..n-1 through the store.
void PutAndPickVictim(const RedisTestCluster& cluster, RedisStore& store, int which, int n,
                      Victim* victim) {
  absl::StatusOr<std::vector<int>> primaries = cluster.Primaries();
  ASSERT_TRUE(primaries.ok()) << primaries.status();
  ASSERT_GT(primaries->size(), size_t(which));
  victim->port = (*primaries)[which];
  for (int i = 0; i < n; ++i) {
    ASSERT_THAT(store.Put(RedisStoreTest::Key(i), RedisStoreTest::Value(i), nullptr), IsOk());
    const bool on_victim = RedisStoreTest::PortOf(store, RedisStoreTest::Key(i)) == victim->port;
    (on_victim ? victim->keys : victim->others).push_back(i);
  }
  ASSERT_GE(victim->keys.size(), 2u);
  ASSERT_FALSE(victim->others.empty());
}

// `n` chunk ids not stored yet whose slots the node on `port` owns in store's slot map.
std::vector<uint64_t> NewKeysOn(RedisStore& store, int port, int n) {
  std::vector<uint64_t> ids;
  for (uint64_t i = 1000; ids.size() < size_t(n); ++i) {
    if (RedisStoreTest::PortOf(store, RedisStoreTest::Key(i)) == port) ids.push_back(i);
  }
  return ids;
}

// Puts the chunks through store, each retried until stored (a writer whose slot map is
// stale may fail until it relearns it) or 30 s have passed.
void PutUntilStored(RedisStore& store, const std::vector<uint64_t>& ids) {
  for (uint64_t id : ids) {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    absl::Status put = store.Put(RedisStoreTest::Key(id), RedisStoreTest::Value(id), nullptr);
    while (!put.ok() && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(50));
      put = store.Put(RedisStoreTest::Key(id), RedisStoreTest::Value(id), nullptr);
    }
    ASSERT_THAT(put, IsOk());
  }
}

TEST_F(RedisStoreTest, PrimaryKilledMissesUntilTheReplicaTakesOver) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::unique_ptr<RedisStore> store = NewStore(StoreOptions());
  ASSERT_NE(store, nullptr);
  Victim v;
  ASSERT_NO_FATAL_FAILURE(PutAndPickVictim(*cluster_, *store, 0, 120, &v));
  ASSERT_THAT(cluster_->WaitReplicated(v.port, absl::Seconds(10)), IsOk());

  cluster_->Signal(v.port, SIGKILL);
  const absl::Time killed = absl::Now();
  int misses = 0;
  bool all_hit = false;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (!all_hit && absl::Now() < give_up) {
    all_hit = true;
    for (uint64_t id : v.keys) {
      const absl::Time start = absl::Now();
      absl::StatusOr<std::string> got = store->Get(Key(id), start + kDeadline);
      ASSERT_LT(absl::Now() - start, kDeadline + kMargin) << "a Get waited past its deadline";
      if (!got.ok()) {
        EXPECT_NE(got.status().code(), absl::StatusCode::kNotFound) << "replicated keys";
        ++misses;
        all_hit = false;
        break;
      }
      EXPECT_EQ(*got, Value(id));
    }
    // The other primaries answer throughout.
    EXPECT_EQ(store->Get(Key(v.others[0]), absl::Now() + kDeadline).value_or(""),
              Value(v.others[0]));
    if (!all_hit) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(all_hit) << "the replica never took over: " << store->last_error();
  std::cout << "the victim's keys hit again " << absl::FormatDuration(absl::Now() - killed)
            << " after its SIGKILL (" << misses << " rounds missed)" << std::endl;
  EXPECT_GT(misses, 0) << "the victim's keys missed while it was down";
  EXPECT_GE(store->cluster_counters().breaker_opens, 1);
  for (uint64_t id : v.others) {
    EXPECT_EQ(store->Get(Key(id), absl::Now() + kDeadline).value_or(""), Value(id));
  }
}

// Node A writes, node B only reads. B learned the slot map and holds a connection to a
// primary that is then killed; B does not watch the failover. Its first Get of each chunk A
// wrote on the dead primary's slots afterwards finds it: the connection error makes B
// relearn the map and ask the replica that took over.
TEST_F(RedisStoreTest, AReaderFindsChunksWrittenAfterAFailoverItDidNotWatch) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::unique_ptr<RedisStore> writer = NewStore(StoreOptions());
  std::unique_ptr<RedisStore> reader = NewStore(StoreOptions());
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(reader, nullptr);
  Victim v;
  ASSERT_NO_FATAL_FAILURE(PutAndPickVictim(*cluster_, *writer, 0, 60, &v));
  for (uint64_t id : v.keys) ASSERT_EQ(reader->Get(Key(id), Deadline()).value_or(""), Value(id));
  const std::vector<uint64_t> fresh = NewKeysOn(*reader, v.port, 8);
  absl::StatusOr<int> replica = cluster_->ReplicaOf(v.port);
  ASSERT_TRUE(replica.ok()) << replica.status();
  ASSERT_THAT(cluster_->WaitReplicated(v.port, absl::Seconds(10)), IsOk());

  cluster_->Signal(v.port, SIGKILL);
  ASSERT_THAT(cluster_->WaitPrimary(*replica, absl::Seconds(30)), IsOk());
  ASSERT_NO_FATAL_FAILURE(PutUntilStored(*writer, fresh));

  const int64_t refreshes = reader->cluster_counters().slot_refreshes;
  for (uint64_t id : fresh) {
    absl::StatusOr<std::string> got = reader->Get(Key(id), absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(got.ok() && *got == Value(id)) << "chunk " << id << ": " << got.status();
  }
  EXPECT_GT(reader->cluster_counters().slot_refreshes, refreshes);
  EXPECT_EQ(PortOf(*reader, Key(fresh[0])), *replica);
  EXPECT_TRUE(reader->Contains(Key(fresh[1])));
  for (uint64_t id : v.keys) {
    absl::StatusOr<std::string> got = reader->Get(Key(id), absl::Now() + kDeadline);
    EXPECT_TRUE(got.ok() && *got == Value(id)) << "chunk " << id << ": " << got.status();
  }
}

// As above, but B read the dead primary right after its SIGKILL: B's breaker for it is open
// (B's clock is a FakeClock that never moves), so no command reaches it. B still relearns the map,
// from the live nodes, and finds every chunk A wrote after the failover.
TEST_F(RedisStoreTest, AReaderBehindAnOpenBreakerRelearnsWhoOwnsTheDeadPrimarysSlots) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::unique_ptr<RedisStore> writer = NewStore(StoreOptions());
  RedisStoreOptions reader_options = StoreOptions();
  reader_options.clock = &clock_;  // never advanced: the breaker stays open
  std::unique_ptr<RedisStore> reader = NewStore(reader_options);
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(reader, nullptr);
  Victim v;
  ASSERT_NO_FATAL_FAILURE(PutAndPickVictim(*cluster_, *writer, 0, 60, &v));
  for (uint64_t id : v.keys) ASSERT_EQ(reader->Get(Key(id), Deadline()).value_or(""), Value(id));
  const std::vector<uint64_t> fresh = NewKeysOn(*reader, v.port, 8);
  const std::string victim_address = "127.0.0.1:" + std::to_string(v.port);
  absl::StatusOr<int> replica = cluster_->ReplicaOf(v.port);
  ASSERT_TRUE(replica.ok()) << replica.status();
  ASSERT_THAT(cluster_->WaitReplicated(v.port, absl::Seconds(10)), IsOk());

  cluster_->Signal(v.port, SIGKILL);
  absl::StatusOr<std::string> during = reader->Get(Key(v.keys[0]), absl::Now() + kDeadline);
  EXPECT_NE(during.status().code(), absl::StatusCode::kNotFound) << "replicated keys";
  ASSERT_TRUE(reader->TEST_cluster().TEST_BreakerOpen(victim_address)) << during.status();
  ASSERT_THAT(cluster_->WaitPrimary(*replica, absl::Seconds(30)), IsOk());
  ASSERT_NO_FATAL_FAILURE(PutUntilStored(*writer, fresh));

  int misses = 0;
  for (uint64_t id : fresh) {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    std::string got = reader->Get(Key(id), absl::Now() + kDeadline).value_or("");
    while (got != Value(id) && absl::Now() < give_up) {
      ++misses;
      absl::SleepFor(absl::Milliseconds(50));
      got = reader->Get(Key(id), absl::Now() + kDeadline).value_or("");
    }
    EXPECT_TRUE(got == Value(id)) << "chunk " << id << ": " << reader->last_error();
  }
  std::cout << "the reader missed " << misses << " Gets of chunks written after the failover"
            << std::endl;
  EXPECT_TRUE(reader->TEST_cluster().TEST_BreakerOpen(victim_address)) << "never probed";
  EXPECT_EQ(PortOf(*reader, Key(fresh[0])), *replica);
}

TEST_F(RedisStoreTest, PrimaryStoppedOpensTheBreakerAndLaterGetsDoNotWait) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  RedisStoreOptions options = StoreOptions();
  options.clock = &clock_;  // the breaker stays open until the test advances it
  std::unique_ptr<RedisStore> store = NewStore(options);
  ASSERT_NE(store, nullptr);
  Victim v;
  ASSERT_NO_FATAL_FAILURE(PutAndPickVictim(*cluster_, *store, 1, 60, &v));
  const std::string victim_address = "127.0.0.1:" + std::to_string(v.port);

  cluster_->Signal(v.port, SIGSTOP);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> first = store->Get(Key(v.keys[0]), start + kDeadline);
  EXPECT_LT(absl::Now() - start, kDeadline + kMargin);
  EXPECT_THAT(first, StatusIs(absl::StatusCode::kDeadlineExceeded));
  std::cout << "the Get of a stopped primary returned after "
            << absl::FormatDuration(absl::Now() - start) << " (command_timeout 1s)" << std::endl;
  const RedisCounterValues after_first = store->cluster_counters();
  EXPECT_GE(after_first.timeouts, 1);
  EXPECT_GE(after_first.breaker_opens, 1);
  EXPECT_TRUE(store->TEST_cluster().TEST_BreakerOpen(victim_address));

  // The breaker is open: the next Get of that node fails at once, without a timeout.
  const absl::Time second_start = absl::Now();
  EXPECT_THAT(store->Get(Key(v.keys[1]), absl::Now() + kDeadline),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("circuit breaker open")));
  std::cout << "the next Get returned after " << absl::FormatDuration(absl::Now() - second_start)
            << std::endl;
  const RedisCounterValues after_second = store->cluster_counters();
  EXPECT_EQ(after_second.timeouts, after_first.timeouts);
  EXPECT_EQ(after_second.breaker_skips, after_first.breaker_skips + 1);
  EXPECT_TRUE(store->Usage().up) << "two primaries of three still answer";
  EXPECT_EQ(store->Get(Key(v.others[0]), absl::Now() + kDeadline).value_or(""), Value(v.others[0]));

  // Resumed: once the breaker period is over one probe goes through, and the keys hit
  // again (on the old primary, or through a MOVED to the replica that took over). A probe
  // that fails doubles the period (8x at most): each round waits that out.
  cluster_->Signal(v.port, SIGCONT);
  bool hit = false;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (!hit && absl::Now() < give_up) {
    clock_.Advance(8 * options.breaker_period);
    hit = store->Get(Key(v.keys[0]), absl::Now() + kDeadline).value_or("") == Value(v.keys[0]);
    if (!hit) absl::SleepFor(absl::Milliseconds(50));  // the cluster's own failover, if any
  }
  EXPECT_TRUE(hit) << store->last_error();
  EXPECT_FALSE(store->TEST_cluster().TEST_BreakerOpen(victim_address) &&
               store->TEST_cluster().TEST_NodeForKey(store->RedisKey(Key(v.keys[0]))) ==
                   victim_address);
}

TEST_F(RedisStoreTest, EveryNodeBehindAnOpenBreakerIsDownUntilAProbeSucceeds) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(PlainRedis()));
  RedisStoreOptions options = StoreOptions();
  options.clock = &clock_;  // the breaker stays open until the test advances it
  std::unique_ptr<RedisStore> store = NewStore(options);
  ASSERT_NE(store, nullptr);
  ASSERT_THAT(store->Put(Key(1), Value(1), nullptr), IsOk());
  ASSERT_TRUE(store->Usage().up);

  const int port = cluster_->ports()[0];
  cluster_->Signal(port, SIGSTOP);
  EXPECT_THAT(store->Get(Key(1), absl::Now() + kDeadline),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(store->TEST_cluster().TEST_BreakerOpen("127.0.0.1:" + std::to_string(port)));
  EXPECT_FALSE(store->Usage().up) << "the only node's breaker is open";

  // Resumed: still down until the breaker period is over; then up, and the next command
  // (a Get, or the background refresh) is the probe.
  cluster_->Signal(port, SIGCONT);
  clock_.Advance(options.breaker_period - absl::Nanoseconds(1));
  EXPECT_FALSE(store->Usage().up) << "a nanosecond before the breaker period is over";
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_TRUE(store->Usage().up) << store->last_error();
  EXPECT_EQ(store->Get(Key(1), absl::Now() + kDeadline).value_or(""), Value(1));
  EXPECT_TRUE(store->Usage().up) << store->last_error();
}

}  // namespace
}  // namespace kvarena::testing
