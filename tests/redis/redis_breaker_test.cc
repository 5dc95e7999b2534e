// RedisNode's circuit breaker on a FakeClock, against GarbageServer (no redis-server): it
// opens on a transport failure, refuses until its period is over on the node's clock (to
// the nanosecond), doubles the period with each failed probe up to 8x, and a successful
// probe closes it. Nothing sleeps.
#include "base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/redis/garbage_server.h"
#include "tests/support/status_matchers.h"
#include "tiers/redis/redis_node.h"

namespace kvarena::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kPeriod = absl::Seconds(1);
constexpr char kGarbage[] = "%%garbage\r\n";  // no reply hiredis can parse: a transport failure

class RedisBreakerTest : public ::testing::Test {
 protected:
  RedisBreakerTest() : server_(kGarbage) {
    options_.connect_timeout = absl::Seconds(2);  // real time: a loaded 2-core machine
    options_.command_timeout = absl::Seconds(2);
    options_.breaker_period = kPeriod;
    options_.clock = &clock_;
  }

  // Runs one PING on node (deadline on the system clock, as in RedisCluster).
  absl::Status Ping(RedisNode& node) {
    return node.Run({{"PING"}}, absl::Now() + absl::Seconds(5)).status();
  }
  bool Open(const RedisNode& node) const { return node.BreakerOpen(clock_.Now()); }

  GarbageServer server_;
  FakeClock clock_;
  RedisConnectOptions options_;
  RedisCounters counters_;
};

TEST_F(RedisBreakerTest, OpensOnAFailureAndClosesExactlyWhenThePeriodPasses) {
  RedisNode node({"127.0.0.1", server_.port()}, options_, &counters_);
  EXPECT_THAT(Ping(node), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(Open(node));
  EXPECT_FALSE(node.healthy());
  EXPECT_EQ(counters_.breaker_opens.load(), 1);

  // Refused at once while open, however long the real time between.
  EXPECT_THAT(Ping(node),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("circuit breaker open")));
  EXPECT_EQ(counters_.breaker_skips.load(), 1);
  clock_.Advance(kPeriod - absl::Nanoseconds(1));
  EXPECT_TRUE(Open(node));
  EXPECT_THAT(Ping(node),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("circuit breaker open")));
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_FALSE(Open(node)) << "the period is over: the next command is the probe";
  EXPECT_FALSE(node.healthy()) << "not healthy before a probe succeeds";

  server_.set_reply("+PONG\r\n");
  EXPECT_THAT(Ping(node), IsOk());
  EXPECT_TRUE(node.healthy());
  EXPECT_FALSE(Open(node));
  EXPECT_EQ(counters_.breaker_opens.load(), 1);
  EXPECT_EQ(counters_.breaker_skips.load(), 2);
}

TEST_F(RedisBreakerTest, EachFailedProbeDoublesThePeriodUpToEightTimes) {
  RedisNode node({"127.0.0.1", server_.port()}, options_, &counters_);
  const int multiples[] = {1, 2, 4, 8, 8, 8};
  for (int m : multiples) {
    SCOPED_TRACE(m);
    // The probe (or first command) fails: a transport failure, not the breaker refusing.
    EXPECT_THAT(Ping(node),
                StatusIs(absl::StatusCode::kUnavailable, Not(HasSubstr("circuit breaker open"))));
    clock_.Advance(m * kPeriod - absl::Nanoseconds(1));
    EXPECT_TRUE(Open(node));
    clock_.Advance(absl::Nanoseconds(1));
    EXPECT_FALSE(Open(node));
  }
  EXPECT_EQ(counters_.breaker_opens.load(), 6);

  // A success resets the doubling: the next failure opens it for one period again.
  server_.set_reply("+PONG\r\n");
  EXPECT_THAT(Ping(node), IsOk());
  server_.set_reply(kGarbage);
  EXPECT_THAT(Ping(node), StatusIs(absl::StatusCode::kUnavailable));
  clock_.Advance(kPeriod - absl::Nanoseconds(1));
  EXPECT_TRUE(Open(node));
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_FALSE(Open(node));
}

}  // namespace
}  // namespace kvarena::testing
