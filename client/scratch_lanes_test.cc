// ScratchLanes: concurrent calls get disjoint slices of the scratch region, a call that
// finds no lane (or no room) is told so instead of waiting, and a lane whose call did not
// provably finish in the daemon is never leased again.
#include "client/scratch_lanes.h"

#include <algorithm>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace kvarena::client_internal {
namespace {

// Leases every free lane; returns them with the lane index each covers.
std::vector<std::pair<int, ScratchLanes::Lease>> AcquireAll(ScratchLanes& lanes) {
  std::vector<std::pair<int, ScratchLanes::Lease>> held;
  while (ScratchLanes::Lease lease = lanes.Acquire()) {
    v1::SharedSlice s;
    EXPECT_NE(lease.Take(1, &s), nullptr);
    held.emplace_back(int(s.offset() / lanes.lane_bytes()), std::move(lease));
  }
  return held;
}

TEST(ScratchLanesTest, LeasesAreDisjointAndComeBack) {
  std::vector<uint8_t> region(4096);
  ScratchLanes lanes(7, region.data(), region.size(), 4);
  EXPECT_EQ(lanes.lane_bytes(), 1024u);
  std::vector<ScratchLanes::Lease> held;
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 4; ++i) {
    held.push_back(lanes.Acquire());
    ASSERT_TRUE(held.back());
    v1::SharedSlice s;
    uint8_t* p = held.back().Take(100, &s);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(s.region_id(), 7u);
    EXPECT_EQ(s.length(), 100u);
    EXPECT_EQ(p, region.data() + s.offset());
    offsets.push_back(s.offset() / 1024);
    held.back().Settle(absl::OkStatus());
  }
  std::sort(offsets.begin(), offsets.end());
  EXPECT_EQ(offsets, (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_FALSE(lanes.Acquire());  // every lane busy: the caller goes inline
  held.pop_back();
  EXPECT_TRUE(lanes.Acquire());
  EXPECT_TRUE(lanes.quarantined().empty());
}

TEST(ScratchLanesTest, TakeStaysInsideItsLane) {
  std::vector<uint8_t> region(4096);
  ScratchLanes lanes(1, region.data(), region.size(), 2);
  ScratchLanes::Lease lease = lanes.Acquire();
  v1::SharedSlice a, b, c;
  ASSERT_NE(lease.Take(1000, &a), nullptr);
  EXPECT_EQ(lease.room(), 2048u - 1024u);
  ASSERT_NE(lease.Take(1, &b), nullptr);
  EXPECT_EQ(b.offset() - a.offset(), 1024u);  // 64-byte aligned slices
  EXPECT_EQ(lease.Take(1024, &c), nullptr);
  EXPECT_EQ(ScratchLanes::Footprint(1), 64u);
}

TEST(ScratchLanesTest, OnlyStatusesThatProveTheHandlerFinishedFreeTheLane) {
  using C = absl::StatusCode;
  for (C code : {C::kOk, C::kInvalidArgument, C::kNotFound, C::kAlreadyExists, C::kPermissionDenied,
                 C::kFailedPrecondition, C::kOutOfRange, C::kResourceExhausted, C::kUnimplemented,
                 C::kUnauthenticated}) {
    EXPECT_TRUE(ScratchLanes::HandlerFinished(code)) << absl::StatusCodeToString(code);
  }
  for (C code : {C::kDeadlineExceeded, C::kCancelled, C::kUnavailable, C::kUnknown, C::kInternal,
                 C::kDataLoss, C::kAborted}) {
    EXPECT_FALSE(ScratchLanes::HandlerFinished(code)) << absl::StatusCodeToString(code);
  }
}

TEST(ScratchLanesTest, QuarantinedLanesNeverComeBackAndTheOthersDo) {
  std::vector<uint8_t> region(8 * 1024);
  ScratchLanes lanes(3, region.data(), region.size(), 8);
  auto held = AcquireAll(lanes);
  ASSERT_EQ(held.size(), 8u);
  // Lanes 0..7 end with these statuses: the odd ones did not provably finish.
  const absl::Status ends[] = {absl::OkStatus(),
                               absl::DeadlineExceededError("deadline"),
                               absl::InvalidArgumentError("bad shape"),
                               absl::CancelledError("cancelled"),
                               absl::ResourceExhaustedError("arena full"),
                               absl::UnavailableError("socket closed"),
                               absl::NotFoundError("no cache"),
                               absl::InternalError("RST_STREAM")};
  std::set<int> bad;
  for (auto& [lane, lease] : held) {
    lease.Settle(ends[lane]);
    if (!ScratchLanes::HandlerFinished(ends[lane].code())) bad.insert(lane);
  }
  held.clear();
  const std::vector<int> q = lanes.quarantined();
  EXPECT_EQ(std::set<int>(q.begin(), q.end()), bad);
  // Many rounds later, only the good lanes are ever leased, and every one of them is.
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE(round);
    auto again = AcquireAll(lanes);
    std::set<int> got;
    for (auto& [lane, lease] : again) {
      got.insert(lane);
      lease.Settle(absl::OkStatus());
    }
    EXPECT_EQ(got, (std::set<int>{0, 2, 4, 6}));
  }
  EXPECT_EQ(lanes.quarantined().size(), 4u);
}

TEST(ScratchLanesTest, EveryLaneQuarantinedMeansInline) {
  std::vector<uint8_t> region(2048);
  ScratchLanes lanes(1, region.data(), region.size(), 2);
  for (auto& [lane, lease] : AcquireAll(lanes)) lease.Settle(absl::DeadlineExceededError("late"));
  EXPECT_FALSE(lanes.Acquire());
  EXPECT_EQ(lanes.quarantined().size(), 2u);
}

TEST(ScratchLanesTest, AnUnsettledLeaseIsQuarantinedOnlyOnceItNamedASlice) {
  std::vector<uint8_t> region(2048);
  ScratchLanes lanes(1, region.data(), region.size(), 2);
  { ScratchLanes::Lease unused = lanes.Acquire(); }  // no slice: nothing was sent
  EXPECT_TRUE(lanes.quarantined().empty());
  {
    ScratchLanes::Lease sent = lanes.Acquire();
    v1::SharedSlice s;
    ASSERT_NE(sent.Take(8, &s), nullptr);
  }
  EXPECT_EQ(lanes.quarantined().size(), 1u);
  // Move-assigning over a settled lease gives its lane back first.
  ScratchLanes::Lease a = lanes.Acquire();
  ASSERT_TRUE(a);
  v1::SharedSlice s;
  ASSERT_NE(a.Take(8, &s), nullptr);
  a.Settle(absl::OkStatus());
  a = ScratchLanes::Lease();
  EXPECT_TRUE(lanes.Acquire());
  EXPECT_EQ(lanes.quarantined().size(), 1u);
}

}  // namespace
}  // namespace kvarena::client_internal
