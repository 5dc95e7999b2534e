// An Attend's work is bounded and the call can be stopped: queries x keys x q heads above
// max_attend_work is refused up front (RESOURCE_EXHAUSTED, tagged, nothing changed; the
// bound itself passes); a StopToken that says stop — before the call, or between the
// kernel's units — ends it with CANCELLED / DEADLINE_EXCEEDED and its append undone.
// Count-based: predicates that say stop from their k-th poll on, never a clock.
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/time/clock.h"
#include "core/refusal.h"
#include "core/store_fixture.h"
#include "core/validate.h"
#include "kernels/stop_token.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;
using Code = absl::StatusCode;

// A StopToken whose predicate says stop from its k-th call on.
class StopAfterPolls {
 public:
  explicit StopAfterPolls(int k)
      : token_(absl::InfiniteFuture(), [this, k] { return ++polls_ >= k; }) {}
  const StopToken* token() const { return &token_; }
  int polls() const { return polls_.load(); }

 private:
  std::atomic<int> polls_{0};
  StopToken token_;
};

class AttendLimitsTest : public StoreTest {
 protected:
  // A store whose Attend may do at most max_work; one float32 cache of 2 kv heads, head_dim
  // 8, with `len` tokens on layer 0, attended with q_heads = 4 (group 2).
  void MakeCache(int64_t max_work, int64_t len, int page_size = 4) {
    StoreOptions o = Options(size_t{64} << 20);
    o.max_attend_work = max_work;
    MakeStore(o);
    id_ = Alloc(Spec(1, 2, 8, DType::kFloat32, {}, 0, page_size), "c");
    if (len > 0) {
      ASSERT_TRUE(AppendRandom(id_, 0, len).ok());
    }
  }
  // Attend n queries at pos; with_kv appends n tokens first. out is NaN-poisoned first.
  absl::StatusOr<AttendResult> Attend(int64_t pos, int64_t n, bool with_kv, uint32_t window = 0,
                                      const StopToken* stop = nullptr) {
    q_ = RandomTensor(rng_, DType::kFloat32, 4, n, 8);
    k_ = RandomTensor(rng_, DType::kFloat32, 2, n, 8);
    AttendArgs a;
    a.cache_id = id_;
    a.pos = pos;
    a.q = q_.Arg();
    if (with_kv) a.k = a.v = k_.Arg();
    a.window = window;
    out_.assign(q_.bytes.size(), 0xFF);
    return store_->Attend("", a, out_.data(), out_.size(), stop);
  }
  // Rows (one query of one head) of out the kernel wrote.
  int64_t RowsWritten() const {
    int64_t rows = 0;
    for (size_t at = 0; at < out_.size(); at += 8 * sizeof(float)) {
      float first;
      std::memcpy(&first, out_.data() + at, sizeof first);
      rows += std::isnan(first) ? 0 : 1;
    }
    return rows;
  }
  uint64_t Refusals() { return store_->CacheStats(id_)->refusals; }

  std::string id_;
  OwnedTensor q_, k_;
  std::vector<uint8_t> out_;
};

TEST_F(AttendLimitsTest, WorkAboveTheBoundIsRefusedUpFrontAndTheBoundPasses) {
  MakeCache(/*max_work=*/6 * 16 * 4, /*len=*/10);
  const Snapshot before = Snap(id_);
  const std::string state = store_->TEST_DebugState();
  // With k/v: 7 queries see up to 10 + 7 keys.
  auto r = Attend(10, 7, /*with_kv=*/true);
  EXPECT_THAT(r, StatusIs(Code::kResourceExhausted,
                          HasSubstr("attend: 7 queries x 17 keys x 4 q heads = 476 exceeds "
                                    "max_attend_work=384; split the call")));
  EXPECT_STREQ(RefusalName(RefusalOf(r.status())), "max_attend_work");
  EXPECT_EQ(RowsWritten(), 0);
  EXPECT_TRUE(Snap(id_) == before);
  EXPECT_EQ(store_->TEST_DebugState(), state);
  EXPECT_EQ(Refusals(), 1u);
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok());

  // Exactly the bound: 6 queries x 16 keys x 4 heads.
  ASSERT_TRUE(Attend(10, 6, /*with_kv=*/true).ok());
  EXPECT_EQ(store_->CacheStats(id_)->seq_len, 16);
  // Over the cache: queries at [9, 16) see up to 16 keys, or the call's window of them.
  EXPECT_THAT(Attend(9, 7, /*with_kv=*/false),
              StatusIs(Code::kResourceExhausted, HasSubstr("= 448")));
  EXPECT_TRUE(Attend(9, 7, /*with_kv=*/false, /*window=*/13).ok());  // 7 x 13 x 4 = 364
  EXPECT_THAT(
      Attend(9, 7, /*with_kv=*/false, /*window=*/14),
      StatusIs(Code::kResourceExhausted, HasSubstr("7 queries x 14 keys x 4 q heads = 392")));
  EXPECT_EQ(Refusals(), 3u);
}

// A call with k/v at the wrong pos is an INVALID_ARGUMENT however large, not a refusal.
TEST_F(AttendLimitsTest, AWrongPosIsNotCountedAsWork) {
  MakeCache(/*max_work=*/1, /*len=*/10);
  EXPECT_THAT(Attend(3, 7, /*with_kv=*/true), StatusIs(Code::kInvalidArgument, HasSubstr("pos=3")));
  EXPECT_THAT(Attend(10, 7, /*with_kv=*/true), StatusIs(Code::kResourceExhausted));
}

TEST(CheckAttendWorkTest, AProductPast63BitsIsRefusedNotWrapped) {
  RequestLimits limits;
  limits.max_attend_work = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(
      CheckAttendWork("attend", int64_t{1} << 20, int64_t{1} << 40, 0, 1 << 16, limits),
      StatusIs(Code::kResourceExhausted,
               HasSubstr("1048576 queries x 1099511627776 keys x 65536 q heads = more than 2^63")));
  EXPECT_TRUE(
      CheckAttendWork("attend", int64_t{1} << 20, int64_t{1} << 40, 1000, 1 << 16, limits).ok());
}

// The default bound passes an 8k-token prefill chunk over a 128k context at 64 q heads and
// refuses the 131,072-query causal call at 32.
TEST(CheckAttendWorkTest, TheDefaultBoundPassesRealisticPrefill) {
  const RequestLimits limits;
  EXPECT_EQ(limits.max_attend_work, StoreOptions{}.max_attend_work);
  EXPECT_TRUE(CheckAttendWork("attend", 8192, 131072 + 8192, 0, 64, limits).ok());
  EXPECT_THAT(CheckAttendWork("attend", 131072, 131072, 0, 32, limits),
              StatusIs(Code::kResourceExhausted,
                       HasSubstr("131072 queries x 131072 keys x 32 q heads = 549755813888 exceeds "
                                 "max_attend_work=137438953472")));
}

TEST_F(AttendLimitsTest, AStoppedCallChangesNothing) {
  MakeCache(/*max_work=*/int64_t{1} << 37, /*len=*/10);
  const Snapshot before = Snap(id_);
  const std::string state = store_->TEST_DebugState();
  StopToken late(absl::Now() - absl::Seconds(1), nullptr);
  EXPECT_THAT(Attend(10, 7, /*with_kv=*/true, 0, &late),
              StatusIs(Code::kDeadlineExceeded, HasSubstr("attend: the call's deadline")));
  StopToken gone(absl::InfiniteFuture(), [] { return true; });
  EXPECT_THAT(Attend(10, 7, /*with_kv=*/true, 0, &gone),
              StatusIs(Code::kCancelled, HasSubstr("the caller cancelled")));
  EXPECT_EQ(RowsWritten(), 0);
  EXPECT_TRUE(Snap(id_) == before);
  EXPECT_EQ(store_->TEST_DebugState(), state);
  EXPECT_EQ(Refusals(), 0u);  // a stop is not a refusal
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok());
}

// The token lets the call start (poll 1), then stops the kernel at its first unit: the
// 7 tokens appended across a page boundary — a new page taken — are taken back.
TEST_F(AttendLimitsTest, AKernelStoppedAfterTheAppendUndoesIt) {
  MakeCache(/*max_work=*/int64_t{1} << 37, /*len=*/10);
  const Snapshot before = Snap(id_);
  const std::string state = store_->TEST_DebugState();
  StopAfterPolls stop(2);
  EXPECT_THAT(Attend(10, 7, /*with_kv=*/true, 0, stop.token()), StatusIs(Code::kCancelled));
  EXPECT_GE(stop.polls(), 2);
  EXPECT_EQ(RowsWritten(), 0);
  EXPECT_TRUE(Snap(id_) == before);
  EXPECT_EQ(store_->TEST_DebugState(), state);
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok());
  // And the cache goes on as if the call never came.
  ASSERT_TRUE(AppendRandom(id_, 0, 7).ok());
  ExpectAttendMatches(id_, 0, 16, 1, 4);
}

// 1024 queries x 2 kv heads: 64 units, each 32 queries of one kv head (its 2 q heads: 64
// output rows). Stopping at the 4th poll (the call's, then one per unit) runs at most 2.
TEST_F(AttendLimitsTest, AStopBetweenUnitsSkipsTheRest) {
  MakeCache(/*max_work=*/int64_t{1} << 37, /*len=*/0, /*page_size=*/16);
  StopAfterPolls stop(4);
  EXPECT_THAT(Attend(0, 1024, /*with_kv=*/true, 0, stop.token()), StatusIs(Code::kCancelled));
  const int64_t rows = 4 * 1024;
  EXPECT_LE(RowsWritten(), 2 * 64) << "of " << rows;
  EXPECT_EQ(store_->CacheStats(id_)->seq_len, 0);
  EXPECT_EQ(PagesUsed(), 0);
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok());
}

}  // namespace
}  // namespace kvarena
