// The CPU attention kernels stop when their StopToken says so: between units, and every
// kTilesPerPoll tiles inside a long one, skipping the rest. Count-based: a predicate that
// says stop from its k-th poll on, never a clock.
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/kv_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv_kernels.h"
#include "kernels/stop_token.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_paged_layer.h"
#include "tests/support/test_seed.h"

namespace kvarena {
namespace {

using kvarena::testing::RandomStored;
using kvarena::testing::StatusIs;
using kvarena::testing::TestPagedLayer;
using ::testing::HasSubstr;

// A StopToken whose predicate says stop from its k-th call on (k = 0: never).
class StopAfterPolls {
 public:
  explicit StopAfterPolls(int k)
      : token_(absl::InfiniteFuture(), [this, k] { return ++polls_ >= k && k > 0; }) {}
  const StopToken* token() const { return &token_; }
  int polls() const { return polls_.load(); }

 private:
  std::atomic<int> polls_{0};
  StopToken token_;
};

class AttentionStopTest : public ::testing::Test {
 protected:
  AttentionStopTest() : seed_(kvarena::testing::TestSeed()), rng_(seed_) {}

  // A float32 layer of len tokens and random queries at [q_pos, q_pos + n).
  void Make(int kv_heads, int64_t len, int64_t n) {
    layout_ = PageLayout{DType::kFloat32, 16, kv_heads, 16};
    layer_ = std::make_unique<TestPagedLayer>(layout_, 0, len, rng_);
    layer_->FillRandom(rng_);
    params_ = AttentionParams{};
    params_.num_q_heads = kv_heads;
    params_.q_pos = len - n;
    params_.n = n;
    params_.scale = 0.25f;
    q_ = RandomStored(layout_.dtype, size_t(kv_heads) * n * layout_.head_dim, rng_);
  }
  // Runs the kernel into a NaN-poisoned output; returns whether it finished.
  bool Run(ThreadPool* pool) {
    out_.assign(q_.size(), 0xFF);
    return PagedAttention(layer_->view(), params_, q_.data(), out_.data(), pool);
  }
  // Output rows (one query of one head) the kernel wrote.
  int64_t RowsWritten() const {
    const size_t row = size_t(layout_.head_dim) * sizeof(float);
    int64_t rows = 0;
    for (size_t at = 0; at < out_.size(); at += row) {
      float first;
      std::memcpy(&first, out_.data() + at, sizeof first);
      rows += std::isnan(first) ? 0 : 1;
    }
    return rows;
  }
  int64_t TotalRows() const { return int64_t(params_.num_q_heads) * params_.n; }

  const uint32_t seed_;
  std::mt19937_64 rng_;
  PageLayout layout_;
  std::unique_ptr<TestPagedLayer> layer_;
  AttentionParams params_;
  std::vector<uint8_t> q_, out_;
};

TEST(StopTokenTest, SaysWhyAndKeepsSayingIt) {
  StopToken never(absl::InfiniteFuture(), nullptr);
  EXPECT_FALSE(never.Poll());
  EXPECT_FALSE(never.stopped());
  EXPECT_TRUE(never.status("attend: ").ok());

  // Past its deadline, a gRPC call reads as cancelled too: the deadline is the reason.
  StopToken late(absl::Now() - absl::Seconds(1), [] { return true; });
  EXPECT_FALSE(late.stopped());  // nothing polled yet
  EXPECT_TRUE(late.Poll());
  EXPECT_THAT(late.status("attend: "), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                                HasSubstr("attend: the call's deadline")));

  bool gone = true;  // the caller went away, then the predicate changed its mind
  StopToken cancelled(absl::InfiniteFuture(), [&gone] { return gone; });
  EXPECT_TRUE(cancelled.Poll());
  gone = false;
  EXPECT_TRUE(cancelled.Poll());
  EXPECT_THAT(cancelled.status(""), StatusIs(absl::StatusCode::kCancelled));
}

// With cancelled_every, the predicate runs at most that often; the deadline at every poll.
TEST(StopTokenTest, AnExpensivePredicateRunsAtMostOncePerInterval) {
  int calls = 0;
  StopToken token(
      absl::InfiniteFuture(), [&calls] { return ++calls > 1000; }, absl::Hours(1));
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(token.Poll());
  EXPECT_EQ(calls, 1);
}

// 4 kv heads x 1024 queries on the calling thread: units of one head x 64 queries, each
// polled once before it runs (their key ranges are shorter than kTilesPerPoll tiles).
TEST_F(AttentionStopTest, StopsBetweenUnitsOnTheCallingThread) {
  Make(/*kv_heads=*/4, /*len=*/1024, /*n=*/1024);
  StopAfterPolls stop(3);
  params_.stop = stop.token();
  EXPECT_FALSE(Run(nullptr));
  EXPECT_EQ(stop.polls(), 3);  // every unit after the stop reads the latch, not the predicate
  EXPECT_GT(RowsWritten(), 0);
  EXPECT_LE(RowsWritten(), 2 * 64) << "of " << TotalRows();
}

// Workers too: a unit runs only after a poll that said go on, and k - 1 of them do.
TEST_F(AttentionStopTest, StopsBetweenUnitsOnThePool) {
  Make(/*kv_heads=*/4, /*len=*/1024, /*n=*/1024);
  ThreadPool pool(3);
  StopAfterPolls stop(3);
  params_.stop = stop.token();
  EXPECT_FALSE(Run(&pool));
  EXPECT_LE(RowsWritten(), 2 * 64) << "of " << TotalRows();
  EXPECT_LE(stop.polls(), 3 + pool.num_threads());  // polls racing the first stop
}

// One decode unit over 64 * 32 * 3 keys: it polls again after kTilesPerPoll tiles and
// returns without writing.
TEST_F(AttentionStopTest, StopsInsideALongUnit) {
  Make(/*kv_heads=*/1, /*len=*/64 * 32 * 3, /*n=*/1);
  StopAfterPolls stop(2);
  params_.stop = stop.token();
  EXPECT_FALSE(Run(nullptr));
  EXPECT_EQ(stop.polls(), 2);
  EXPECT_EQ(RowsWritten(), 0);
}

// A token that never stops changes nothing: same bytes as no token, pooled (splits and
// their merge) and not.
TEST_F(AttentionStopTest, ATokenThatNeverStopsGivesTheSameOutput) {
  ThreadPool pool(3);
  for (int64_t n : {1, 300}) {
    SCOPED_TRACE(n);
    Make(/*kv_heads=*/2, /*len=*/5000, n);
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      params_.stop = nullptr;
      ASSERT_TRUE(Run(p));
      const std::vector<uint8_t> plain = out_;
      StopAfterPolls never(0);
      params_.stop = never.token();
      ASSERT_TRUE(Run(p));
      EXPECT_EQ(out_, plain);
      EXPECT_GT(never.polls(), 0);
    }
  }
}

// A batch stopped before it starts writes nothing, and KvKernels says why.
TEST_F(AttentionStopTest, TheKvKernelsReturnTheTokensStatus) {
  Make(/*kv_heads=*/2, /*len=*/200, /*n=*/1);
  std::unique_ptr<KvKernels> kernels = NewCpuKvKernels(2);
  StopToken late(absl::Now() - absl::Seconds(1), nullptr);
  params_.stop = &late;
  out_.assign(q_.size(), 0xFF);
  EXPECT_THAT(kernels->PagedAttention(layer_->view(), params_, q_.data(), out_.data()),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  const int64_t pos[2] = {199, 199};
  const PagedKvView views[2] = {layer_->view(), layer_->view()};
  std::vector<uint8_t> q2(2 * q_.size()), out2(2 * q_.size(), 0xFF);
  EXPECT_THAT(kernels->PagedAttentionBatch(views, pos, 2, params_, q2.data(), out2.data()),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(out2, std::vector<uint8_t>(out2.size(), 0xFF));
  params_.stop = nullptr;
  EXPECT_TRUE(kernels->PagedAttention(layer_->view(), params_, q_.data(), out_.data()).ok());
}

}  // namespace
}  // namespace kvarena
