// Offload (daemon/offload.h) and which calls the service runs inline on gRPC's callback
// threads (daemon/service.h RunsInline). No timing: tasks meet through notifications.
// Each task holds 1 byte of a pool bounded only by UINT64_MAX, unless a test says so.
#include "daemon/offload.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "core/refusal.h"
#include "daemon/busy_caches.h"
#include "daemon/service.h"

namespace kvarena {
namespace {

constexpr uint64_t kNoBound = ~uint64_t{0};

TEST(OffloadTest, RunsTasksConcurrentlyUpToMaxThreads) {
  Offload pool(2, kNoBound);
  absl::Notification release;
  absl::BlockingCounter both_running(2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(pool.Run(1,
                         [&] {
                           both_running.DecrementCount();
                           release.WaitForNotification();
                         })
                    .ok());
  }
  both_running.Wait();  // a second task started while the first still ran
  EXPECT_EQ(pool.TEST_threads(), 2);
  release.Notify();
}

TEST(OffloadTest, QueuesBeyondMaxThreadsInArrivalOrder) {
  std::vector<int> order;
  {
    Offload pool(1, kNoBound);
    absl::Notification release;
    ASSERT_TRUE(pool.Run(1, [&] { release.WaitForNotification(); }).ok());
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(pool.Run(1, [&order, i] { order.push_back(i); }).ok());
    EXPECT_EQ(pool.TEST_threads(), 1);
    release.Notify();
  }  // the destructor runs every queued task
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(OffloadTest, DestructorWaitsForEveryTask) {
  std::atomic<int> ran{0};
  {
    Offload pool(3, kNoBound);
    for (int i = 0; i < 50; ++i) ASSERT_TRUE(pool.Run(1, [&] { ran.fetch_add(1); }).ok());
  }
  EXPECT_EQ(ran.load(), 50);
}

TEST(OffloadTest, RefusesATaskPastMaxBytesWhileItHoldsOthers) {
  Offload pool(1, 1000);
  absl::Notification release;
  ASSERT_TRUE(pool.Run(600, [&] { release.WaitForNotification(); }).ok());
  ASSERT_TRUE(pool.Run(400, [] {}).ok());  // queued: exactly at the bound
  bool ran = false;
  const absl::Status refused = pool.Run(1, [&] { ran = true; });
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RefusalOf(refused), Refusal::kMaxQueuedBytes);
  EXPECT_EQ(refused.message(),
            "the daemon's pool holds 2 calls of 1000 request bytes; this call's 1 would pass "
            "--max_queued_bytes=1000; retry later");
  EXPECT_EQ(pool.TEST_held_bytes(), 1000u);
  release.Notify();
  absl::Notification done;
  // Once both ran the pool holds nothing and takes a call larger than the bound.
  while (!pool.Run(5000, [&] { done.Notify(); }).ok()) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  done.WaitForNotification();
  EXPECT_FALSE(ran) << "a refused task never runs";
}

TEST(OffloadTest, TakesACallLargerThanTheBoundWhenItHoldsNothing) {
  Offload pool(1, 10);
  absl::Notification release;
  ASSERT_TRUE(pool.Run(100, [&] { release.WaitForNotification(); }).ok());
  EXPECT_EQ(RefusalOf(pool.Run(1, [] {})), Refusal::kMaxQueuedBytes);
  release.Notify();
}

v1::Tensor Shaped(std::vector<int64_t> shape) {
  v1::Tensor t;
  for (int64_t d : shape) t.add_shape(d);
  return t;
}

TEST(RunsInlineTest, AttendByWork) {
  struct Case {
    const char* name;
    std::vector<int64_t> q;
    uint64_t pos;
    bool inline_;
  };
  const Case cases[] = {
      {"decode over 4096 tokens, 32 heads x 128", {1, 32, 1, 128}, 4095, true},
      {"decode over 8191 tokens", {1, 32, 1, 128}, 8190, true},
      {"decode over 32768 tokens", {1, 32, 1, 128}, 32767, false},
      {"prefill of 512 queries", {1, 32, 512, 128}, 0, false},
      {"3-d q (refused later)", {32, 1, 128}, 0, false},
      {"negative dimension", {1, -32, 1, 128}, 0, false},
      {"dimension past every bound", {1, int64_t{1} << 62, 1, int64_t{1} << 62}, 0, false},
      {"pos past every bound", {1, 1, 1, 1}, ~uint64_t{0}, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::AttendRequest req;
    *req.mutable_q() = Shaped(c.q);
    req.set_pos(c.pos);
    EXPECT_EQ(RunsInline(req), c.inline_);
  }
}

TEST(RunsInlineTest, AppendByPayloadBytes) {
  v1::AppendRequest req;
  req.mutable_k()->set_data(std::string(2048, 'k'));  // one decode token, 8 heads x 128 f16
  req.mutable_v()->set_data(std::string(2048, 'v'));
  EXPECT_TRUE(RunsInline(req));
  req.mutable_v()->set_data(std::string(kInlineAppendBytes, 'v'));
  EXPECT_FALSE(RunsInline(req));
  req.mutable_v()->mutable_shared()->set_length(~uint64_t{0});  // would wrap if added
  EXPECT_FALSE(RunsInline(req));
  req.mutable_k()->mutable_shared()->set_length(kInlineAppendBytes / 2);
  req.mutable_v()->mutable_shared()->set_length(kInlineAppendBytes / 2);
  EXPECT_TRUE(RunsInline(req));
}

TEST(RunsInlineTest, IdsAndItemsByCount) {
  v1::AllocateRequest alloc;
  for (int i = 0; i < kInlineTokens; ++i) alloc.add_prompt_tokens(i);
  EXPECT_TRUE(RunsInline(alloc, /*tiers=*/false));
  EXPECT_FALSE(RunsInline(alloc, /*tiers=*/true)) << "its lookup may read a hung tier";
  alloc.add_prompt_tokens(0);
  EXPECT_FALSE(RunsInline(alloc, false));
  EXPECT_TRUE(RunsInline(v1::AllocateRequest(), /*tiers=*/true)) << "no prompt: no lookup";
  v1::SetTokensRequest set;
  for (int i = 0; i <= kInlineTokens; ++i) set.add_token_ids(i);
  EXPECT_FALSE(RunsInline(set));
  v1::ReserveRequest reserve;
  for (int i = 0; i < kInlineItems; ++i) reserve.add_items()->set_cache_id("c");
  EXPECT_TRUE(RunsInline(reserve));
  v1::CommitRequest commit;
  for (int i = 0; i <= kInlineItems; ++i) commit.add_items()->set_cache_id("c");
  EXPECT_FALSE(RunsInline(commit));
}

TEST(BusyCachesTest, ACacheIsBusyWhileAnyPooledCallHoldsIt) {
  BusyCaches busy;
  const std::vector<absl::string_view> a = {"a"}, ab = {"a", "b"}, b = {"b"}, c = {"c"};
  EXPECT_FALSE(busy.Busy(a));
  busy.Hold(ab);
  busy.Hold(a);  // a second pooled call on "a"
  EXPECT_TRUE(busy.Busy(a));
  EXPECT_TRUE(busy.Busy(b));
  EXPECT_FALSE(busy.Busy(c));
  busy.Release(ab);
  EXPECT_TRUE(busy.Busy(a)) << "the second call still holds it";
  EXPECT_FALSE(busy.Busy(b));
  busy.Release(a);
  EXPECT_FALSE(busy.Busy(a));
  EXPECT_EQ(busy.TEST_held(), 0);
}

TEST(BusyCachesTest, NoCacheIsNeverHeld) {
  BusyCaches busy;
  const std::vector<absl::string_view> none = {""};  // a whole-arena Stats names no cache
  busy.Hold(none);
  EXPECT_FALSE(busy.Busy(none));
  EXPECT_EQ(busy.TEST_held(), 0);
  busy.Release(none);
}

}  // namespace
}  // namespace kvarena
