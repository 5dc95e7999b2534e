// ScratchLanes: concurrent calls get disjoint slices of the scratch region, and a call
// that finds no lane (or no room) is told so instead of waiting.
#include "client/scratch_lanes.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace kvarena::client_internal {
namespace {

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
  }
  std::sort(offsets.begin(), offsets.end());
  EXPECT_EQ(offsets, (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_FALSE(lanes.Acquire());  // every lane busy: the caller goes inline
  held.pop_back();
  EXPECT_TRUE(lanes.Acquire());
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

}  // namespace
}  // namespace kvarena::client_internal
