// RedisStore while a Redis Cluster fails: a primary SIGKILLed (its replica takes over) and
// a primary SIGSTOPped (the circuit breaker stops the waiting). Nothing asserts on the
// wall clock beyond "returned by the deadline plus a generous margin".
#include <signal.h>

#include <iostream>
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

TEST_F(RedisStoreTest, PrimaryStoppedOpensTheBreakerAndLaterGetsDoNotWait) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  RedisStoreOptions options = StoreOptions();
  options.breaker_period = absl::Seconds(5);  // outlasts the checks while it is open, loaded
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

  // Resumed: after the breaker period one probe goes through, and the keys hit again
  // (on the old primary, or through a MOVED to the replica that took over).
  cluster_->Signal(v.port, SIGCONT);
  bool hit = false;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (!hit && absl::Now() < give_up) {
    hit = store->Get(Key(v.keys[0]), absl::Now() + kDeadline).value_or("") == Value(v.keys[0]);
    if (!hit) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(hit) << store->last_error();
  EXPECT_FALSE(store->TEST_cluster().TEST_BreakerOpen(victim_address) &&
               store->TEST_cluster().TEST_NodeForKey(store->RedisKey(Key(v.keys[0]))) ==
                   victim_address);
}

TEST_F(RedisStoreTest, EveryNodeBehindAnOpenBreakerIsDownUntilAProbeSucceeds) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(PlainRedis()));
  RedisStoreOptions options = StoreOptions();
  options.breaker_period = absl::Seconds(5);  // outlasts the checks while it is open, loaded
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

  // Resumed: the background refresh probes the node once the breaker period is over.
  cluster_->Signal(port, SIGCONT);
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (!store->Usage().up && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(store->Usage().up) << store->last_error();
  EXPECT_EQ(store->Get(Key(1), absl::Now() + kDeadline).value_or(""), Value(1));
}

}  // namespace
}  // namespace kvarena::testing
