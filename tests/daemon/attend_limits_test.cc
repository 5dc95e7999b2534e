// A served Attend is bounded and stops when its caller stops waiting, against a real
// kvarenad: a 131,072-query causal prefill sent with a 1 s deadline ends
// DEADLINE_EXCEEDED (or CANCELLED when the caller cancels) with the cache unchanged, the
// daemon answering other channels meanwhile and after; a call above --max_attend_work is
// refused up front with the numbers. Nothing asserts on elapsed time: the test prints how
// long the cache stayed locked after the deadline (the kernel's reaction time). Snapshots
// are compared with ==: a diff of their MiBs of K/V would help no one.
#include <atomic>
#include <iostream>
#include <thread>

#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using grpc::StatusCode;

constexpr int kQueries = 131072;
constexpr int kHeadDim = 16;

class AttendLimitsTest : public KvarenadTest {
 protected:
  void SetUp() override {}  // each test starts the daemon with its flags
  // A float16 cache of one layer, one kv head of head_dim d, and the request that prefills
  // n tokens into it from position 0 with q_heads query heads.
  v1::AttendRequest Prefill(int n, int q_heads, int d) {
    id_ = Allocate(Spec(1, 1, d, v1::FLOAT16, 16));
    v1::AttendRequest req;
    req.set_cache_id(id_);
    req.set_pos(0);
    *req.mutable_q() = RandomTensor(v1::FLOAT16, q_heads, n, d, 1);
    *req.mutable_k() = RandomTensor(v1::FLOAT16, 1, n, d, 2);
    *req.mutable_v() = RandomTensor(v1::FLOAT16, 1, n, d, 3);
    return req;
  }

  // Sends req on the fixture's channel from another thread, with `deadline`; meanwhile
  // pings the daemon on a second channel, each ping asserted OK. `cancel_after` > 0:
  // the caller cancels the call that long after sending it.
  grpc::Status AttendWhilePinging(const v1::AttendRequest& req, absl::Duration deadline,
                                  absl::Duration cancel_after = absl::ZeroDuration()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    grpc::Status status;
    std::atomic<bool> done{false};
    std::thread call([&] {
      v1::AttendResponse resp;
      status = stub_->Attend(&ctx, req, &resp);
      done = true;
    });
    auto other = v1::KvCacheService::NewStub(daemon_->NewChannel());
    const absl::Time start = absl::Now();
    int pings = 0;
    bool cancelled = false;
    while (!done) {
      v1::PingResponse pong;
      EXPECT_TRUE(other->Ping(Ctx().get(), v1::PingRequest(), &pong).ok());
      ++pings;
      if (cancel_after > absl::ZeroDuration() && !cancelled &&
          absl::Now() - start >= cancel_after) {
        ctx.TryCancel();
        cancelled = true;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    call.join();
    std::cout << "answered " << pings << " pings on another channel during the Attend\n";
    return status;
  }

  // Stats of the cache, on a fresh channel; it waits for the cache's lock, which the
  // Attend holds while its kernel runs. Prints how long that took.
  v1::StatsResponse CacheStatsAfter(const char* what) {
    auto other = v1::KvCacheService::NewStub(daemon_->NewChannel());
    v1::StatsRequest req;
    req.set_cache_id(id_);
    v1::StatsResponse resp;
    const absl::Time start = absl::Now();
    EXPECT_TRUE(other->Stats(Ctx().get(), req, &resp).ok());
    std::cout << "the cache's Stats answered " << absl::FormatDuration(absl::Now() - start)
              << " after the caller's " << what << " (the kernel's reaction time)\n";
    return resp;
  }

  std::string id_;
};

// 131,072 queries x 131,072 keys x 1 head of 16, causal: tens of CPU-seconds.
TEST_F(AttendLimitsTest, APrefillPastItsDeadlineStopsAndChangesNothing) {
  StartDaemon({"--arena_bytes=256Mi", "--max_attend_work=" + std::to_string(int64_t{1} << 40)});
  const v1::AttendRequest req = Prefill(kQueries, 1, kHeadDim);
  const std::string before = Snapshot(id_);
  EXPECT_THAT(AttendWhilePinging(req, absl::Seconds(1)), StatusIs(StatusCode::DEADLINE_EXCEEDED));
  const v1::StatsResponse stats = CacheStatsAfter("deadline");
  EXPECT_EQ(stats.pages().seq_len(), 0u);
  EXPECT_EQ(stats.pages().pages_used(), 0u);
  EXPECT_TRUE(Snapshot(id_) == before) << "the cache changed";
  EXPECT_EQ(Stats().pages().pages_used(), 0u);  // the arena too
  v1::PingResponse pong;
  EXPECT_TRUE(stub_->Ping(Ctx().get(), v1::PingRequest(), &pong).ok());
}

TEST_F(AttendLimitsTest, APrefillItsCallerCancelsStopsAndChangesNothing) {
  StartDaemon({"--arena_bytes=256Mi", "--max_attend_work=" + std::to_string(int64_t{1} << 40)});
  const v1::AttendRequest req = Prefill(kQueries, 1, kHeadDim);
  const std::string before = Snapshot(id_);
  EXPECT_THAT(AttendWhilePinging(req, absl::Seconds(60), absl::Milliseconds(500)),
              StatusIs(StatusCode::CANCELLED));
  EXPECT_EQ(CacheStatsAfter("cancel").pages().seq_len(), 0u);
  EXPECT_TRUE(Snapshot(id_) == before) << "the cache changed";
}

// A long Attend runs on the daemon's pool and holds its cache; calls that then wait for
// that cache's lock go to the pool too (daemon/busy_caches.h), so gRPC's few callback
// threads keep reading: with 64 such calls queued, the health service and Ping on another
// channel are answered while the Attend still runs. (Were those calls run on the callback
// threads, they would hold every one of them until the Attend ended.)
TEST_F(AttendLimitsTest, CallsQueuedOnABusyCacheLeaveEveryoneElseServed) {
  StartDaemon({"--arena_bytes=256Mi", "--max_attend_work=" + std::to_string(int64_t{1} << 40)});
  const v1::AttendRequest req = Prefill(kQueries, 1, kHeadDim);
  grpc::ClientContext attend_ctx;
  attend_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(5)));
  std::atomic<bool> attend_done{false};
  std::thread attend([&] {
    v1::AttendResponse resp;
    stub_->Attend(&attend_ctx, req, &resp);
    attend_done = true;
  });
  // The Attend holds the cache once a Describe of it cannot get its lock in 100 ms. Probed
  // for up to a minute (not a count of probes: before the Attend arrives each Describe
  // answers at once, and a slow build, TSan's, can take that long to send it).
  auto probe = v1::KvCacheService::NewStub(daemon_->NewChannel());
  bool held = false;
  for (const absl::Time until = absl::Now() + absl::Minutes(1);
       absl::Now() < until && !held && !attend_done;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
    v1::DescribeRequest d;
    d.set_cache_id(id_);
    v1::DescribeResponse resp;
    held = probe->Describe(&ctx, d, &resp).error_code() == StatusCode::DEADLINE_EXCEEDED;
  }
  if (!held) {
    attend_ctx.TryCancel();
    attend.join();
    FAIL() << "the Attend never held its cache";
  }

  constexpr int kWaiters = 64;
  std::vector<std::unique_ptr<grpc::ClientContext>> waiter_ctx;
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiter_ctx.push_back(Ctx());
    waiter_ctx.back()->set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(5)));
    waiters.emplace_back([&, ctx = waiter_ctx.back().get()] {
      v1::PopnRequest popn;
      popn.set_cache_id(id_);
      v1::PopnResponse resp;
      stub_->Popn(ctx, popn, &resp);  // answered once the Attend ends, however it ends
    });
  }
  absl::SleepFor(absl::Seconds(1));  // lets the waiters reach the daemon (not an assertion)

  auto channel = daemon_->NewChannel();
  grpc::ClientContext health_ctx;
  health_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::health::v1::HealthCheckResponse health;
  EXPECT_TRUE(grpc::health::v1::Health::NewStub(channel)
                  ->Check(&health_ctx, grpc::health::v1::HealthCheckRequest(), &health)
                  .ok());
  v1::PingResponse pong;
  EXPECT_TRUE(
      v1::KvCacheService::NewStub(channel)->Ping(Ctx().get(), v1::PingRequest(), &pong).ok());
  EXPECT_FALSE(attend_done) << "the Attend ended first: nothing was shown";
  attend_ctx.TryCancel();
  attend.join();
  for (std::thread& t : waiters) t.join();
}

// The default --max_attend_work (2^37) refuses 65,536 queries x 65,536 keys x 64 q heads
// before anything is appended, and says how to fix it.
TEST_F(AttendLimitsTest, WorkAboveTheDefaultBoundIsRefusedUpFront) {
  StartDaemon({"--arena_bytes=64Mi"});
  const v1::AttendRequest req = Prefill(65536, 64, 1);
  const std::string before = Snapshot(id_);
  v1::AttendResponse resp;
  EXPECT_THAT(stub_->Attend(Ctx().get(), req, &resp),
              StatusIs(StatusCode::RESOURCE_EXHAUSTED,
                       "attend: 65536 queries x 65536 keys x 64 q heads = 274877906944 exceeds "
                       "max_attend_work=137438953472; split the call"));
  EXPECT_TRUE(Snapshot(id_) == before) << "the cache changed";
  EXPECT_EQ(Stats(id_).pages().refusals(), 1u);
}

}  // namespace
}  // namespace kvarena
