// Scratch-lane quarantine through a real kvarenad (client/scratch_lanes.h): a zero-copy
// Attend that times out leaves its handler running in the daemon, still writing `out`
// into the lane it was given. The client must never lease that lane again: the calls that
// follow, while the straggler runs on and after it finished, return exactly what they
// returned before the timeout (and what a float64 reference and an inline run give).
//
// The straggler is made slow by size, not by sleeping: --num_threads=1 and 128 queries of
// 16 heads over a long context. Its time is measured first and the worker's deadline set
// to a quarter of it, so the test holds on fast and slow machines alike; it asserts
// nothing about durations, it prints them.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "client/client_test_peer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvarena/client.h"
#include "tests/daemon/daemon_process.h"
#include "tests/support/kv_history.h"
#include "tests/support/status_matchers.h"

namespace kvarena {
namespace {

using testing::HostTensor;
using testing::IsOk;
using testing::KvHistory;
using testing::StatusIs;

constexpr int kKvHeads = 4, kQHeads = 16, kHeadDim = 128;
constexpr int64_t kQueries = 128;          // q is 512 KiB of fp16, out as much: one lane
constexpr int64_t kLongContext = 1 << 16;  // the straggler's keys: 128 MiB of K+V
constexpr int64_t kShortContext = kQueries;
constexpr uint64_t kSeed = 29;

class ScratchQuarantineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(
        std::vector<std::string>{"--arena_bytes=512Mi", "--num_threads=1"});
    ASSERT_TRUE(daemon_->WaitServing()) << daemon_->Log();
    ClientOptions owner;
    owner.attach = false;  // its caches belong to no session: the worker opens them
    auto c = Client::Connect(daemon_->address(), owner);
    ASSERT_THAT(c, IsOk());
    owner_ = *c;
  }
  void TearDown() override {
    owner_.reset();
    daemon_.reset();
  }
  std::shared_ptr<GenericKvCacheHandle> Allocate() {
    CacheSpec spec{1, kKvHeads, kHeadDim, DType::kFloat16, 16, {}, 0, ""};
    auto h = owner_->Allocate(spec);
    EXPECT_THAT(h, IsOk());
    return h.ok() ? *h : nullptr;
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::shared_ptr<Client> owner_;
  std::mt19937_64 rng_{kSeed};
};

TEST_F(ScratchQuarantineTest, ATimedOutCallsLaneIsNeverReusedAndLaterCallsStayExact) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  // The long cache: one 1024-token block appended over and over (its values do not matter).
  auto long_cache = Allocate();
  ASSERT_NE(long_cache, nullptr);
  HostTensor block = testing::RandomTensor(rng_, DType::kFloat16, kKvHeads, 1024, kHeadDim);
  for (int64_t at = 0; at < kLongContext; at += 1024) {
    ASSERT_THAT(long_cache->append(0, block.arg(), block.arg()), IsOk());
  }
  // The short cache, with a reference of what it holds.
  auto short_cache = Allocate();
  ASSERT_NE(short_cache, nullptr);
  KvHistory history(kKvHeads, kHeadDim);
  HostTensor k = testing::RandomTensor(rng_, DType::kFloat16, kKvHeads, kShortContext, kHeadDim);
  HostTensor v = testing::RandomTensor(rng_, DType::kFloat16, kKvHeads, kShortContext, kHeadDim);
  ASSERT_THAT(short_cache->append(0, k.arg(), v.arg()), IsOk());
  history.Append(k, v);

  // How long the straggler's Attend takes on this machine (measured, never asserted), so
  // the worker's deadline can sit between it and the short calls' milliseconds.
  HostTensor slow_q = testing::RandomTensor(rng_, DType::kFloat16, kQHeads, kQueries, kHeadDim);
  const absl::Time c0 = absl::Now();
  ASSERT_THAT(long_cache->attention(0, kLongContext - kQueries, slow_q.arg()), IsOk());
  const absl::Duration straggler = absl::Now() - c0;

  // The worker: zero-copy tensors, and a deadline the long Attend cannot meet.
  ClientOptions options;
  options.call_timeout = std::max(straggler / 4, absl::Milliseconds(50));
  auto worker = Client::Connect(daemon_->address(), options);
  ASSERT_THAT(worker, IsOk());
  auto slow = (*worker)->OpenCache(long_cache->cache_id());
  auto fast = (*worker)->OpenCache(short_cache->cache_id());
  ASSERT_THAT(slow, IsOk());
  ASSERT_THAT(fast, IsOk());

  // Before: the short Attend through a lane, checked against float64 and an inline run.
  HostTensor q = testing::RandomTensor(rng_, DType::kFloat16, kQHeads, kQueries, kHeadDim);
  auto want = (*fast)->attention(0, 0, q.arg());
  ASSERT_THAT(want, IsOk());
  EXPECT_THAT(testing::CompareOutput("short attend", *want, history.Attention(q, 0, 0, 0)), IsOk());
  ClientOptions inline_options;
  inline_options.inline_tensors = true;
  auto inline_client = Client::Connect(daemon_->address(), inline_options);
  ASSERT_THAT(inline_client, IsOk());
  auto inline_fast = (*inline_client)->OpenCache(short_cache->cache_id());
  ASSERT_THAT(inline_fast, IsOk());
  auto inline_out = (*inline_fast)->attention(0, 0, q.arg());
  ASSERT_THAT(inline_out, IsOk());
  ASSERT_EQ(inline_out->data, want->data);
  EXPECT_EQ(client_internal::ClientTestPeer(**worker).QuarantinedLanes(), 0);

  // The straggler: its lane is the one the next call would get from the free list.
  const absl::Time t0 = absl::Now();
  EXPECT_THAT((*slow)->attention(0, kLongContext - kQueries, slow_q.arg()),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(client_internal::ClientTestPeer(**worker).QuarantinedLanes(), 1);

  // Describe waits for the cache's lock, which the straggler holds until it finishes.
  std::atomic<bool> straggler_done{false};
  std::thread waiter([&] {
    EXPECT_THAT(long_cache->refresh(), IsOk());
    straggler_done.store(true);
  });
  int calls = 0, wrong = 0;
  for (int after = 0; after < 20; after += straggler_done.load() ? 1 : 0) {
    auto out = (*fast)->attention(0, 0, q.arg());
    ASSERT_THAT(out, IsOk()) << "call " << calls;
    ++calls;
    wrong += out->data != want->data;
  }
  waiter.join();
  std::printf(
      "straggler took %s alone, ran %s against a %s deadline; %d calls alongside and "
      "after it, %d wrong\n",
      absl::FormatDuration(straggler).c_str(), absl::FormatDuration(absl::Now() - t0).c_str(),
      absl::FormatDuration(options.call_timeout).c_str(), calls, wrong);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(client_internal::ClientTestPeer(**worker).QuarantinedLanes(), 1);
}

}  // namespace
}  // namespace kvarena
