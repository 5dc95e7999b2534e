// Scratch regions cost the arena only once used: a session's scratch region is listed at
// attach, created and charged to arena_bytes at its first export, refunded when the
// session's grace ends; a peer that cannot map (TCP) gets none and charges nothing; an
// export the budget cannot cover is refused (arena_full) and the session works without.
#include <unistd.h>

#include "core/refusal.h"
#include "core/store_fixture.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;
using Code = absl::StatusCode;

class ScratchChargeTest : public StoreTest {
 protected:
  // The session's scratch region as SessionRegions lists it.
  RegionInfo ScratchOf(const std::string& session) {
    absl::StatusOr<std::vector<RegionInfo>> regions = store_->SessionRegions(session);
    EXPECT_TRUE(regions.ok()) << regions.status();
    for (const RegionInfo& r : *regions) {
      if (r.scratch) return r;
    }
    ADD_FAILURE() << "no scratch region listed";
    return {};
  }
  size_t Committed() { return store_->Stats().bytes_committed; }
};

TEST_F(ScratchChargeTest, AttachChargesNothingFirstExportChargesEndRefunds) {
  const std::string s = *store_->OpenSession("w");
  const RegionInfo r = ScratchOf(s);
  EXPECT_EQ(r.size, kChunkGranularity);
  EXPECT_EQ(r.kind, "host_memfd");
  EXPECT_EQ(Committed(), 0u);
  EXPECT_EQ(store_->Stats().scratch_regions, 0);
  // Before it is mapped, a slice cannot name it.
  EXPECT_THAT(store_->ResolveSlice(s, r.region_id, 0, 1), StatusIs(Code::kFailedPrecondition));

  absl::StatusOr<std::vector<SharedPiece>> pieces = store_->ExportRegion(s, r.region_id);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  for (const SharedPiece& p : *pieces) close(p.fd);
  EXPECT_EQ(Committed(), kChunkGranularity);
  EXPECT_EQ(store_->Stats().scratch_bytes, kChunkGranularity);
  EXPECT_TRUE(store_->ResolveSlice(s, r.region_id, 0, 1).ok());
  // A second export maps the same region: nothing more is charged.
  pieces = store_->ExportRegion(s, r.region_id);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  for (const SharedPiece& p : *pieces) close(p.fd);
  EXPECT_EQ(Committed(), kChunkGranularity);

  store_->DetachSession(s, absl::Seconds(1));
  EXPECT_EQ(Committed(), kChunkGranularity);  // in its grace: still held
  clock_.Advance(absl::Seconds(1));
  store_->Reap();
  EXPECT_EQ(Committed(), 0u);
  EXPECT_EQ(store_->Stats().scratch_regions, 0);
}

TEST_F(ScratchChargeTest, APeerThatCannotMapGetsNoScratch) {
  SessionPeer tcp;
  tcp.can_map = false;
  absl::StatusOr<SessionAttachment> a = store_->AttachSession("tcp", "", tcp);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::vector<RegionInfo>> regions = store_->SessionRegions(a->session_id);
  ASSERT_TRUE(regions.ok()) << regions.status();
  EXPECT_TRUE(regions->empty());
  // Not even a guess at its id maps one.
  const RegionInfo local = ScratchOf(*store_->OpenSession("unix"));
  EXPECT_THAT(store_->ExportRegion(a->session_id, local.region_id - 1),
              StatusIs(Code::kPermissionDenied));
  EXPECT_EQ(Committed(), 0u);
}

TEST_F(ScratchChargeTest, IdleSessionsLeaveTheWholeArenaToPages) {
  MakeStore(4 * kChunkGranularity);
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(store_->OpenSession("idle").ok());
  // Every page of the arena (16 scratch charges would have been four times all of it).
  const int64_t page_bytes = 4 * 2 * 8 * 4 * 2;  // page_size 4, 2 heads, dim 8, f32, K and V
  const int64_t tokens = int64_t(4 * kChunkGranularity) / page_bytes * 4;
  const std::string id = Alloc(Spec(1, 2, 8));
  absl::StatusOr<std::vector<ReserveResult>> r = store_->Reserve("", {{id, tokens}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Committed(), 4 * kChunkGranularity);
  EXPECT_EQ(store_->Stats().pages.pages_free, 0);
}

TEST_F(ScratchChargeTest, AnExportTheArenaCannotCoverIsRefused) {
  StoreOptions o = Options(size_t{4} << 20);
  o.scratch_bytes = size_t{8} << 20;
  MakeStore(o);
  const std::string s = *store_->OpenSession("w");
  const RegionInfo r = ScratchOf(s);
  absl::StatusOr<std::vector<SharedPiece>> pieces = store_->ExportRegion(s, r.region_id);
  EXPECT_THAT(pieces, StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(std::string(pieces.status().message()), HasSubstr("scratch_bytes=8388608"));
  EXPECT_THAT(std::string(pieces.status().message()), HasSubstr("arena_bytes=4194304"));
  EXPECT_STREQ(RefusalName(RefusalOf(pieces.status())), "arena_full");
  EXPECT_EQ(store_->Stats().scratch_regions, 0);
  EXPECT_THAT(store_->ResolveSlice(s, r.region_id, 0, 1), StatusIs(Code::kFailedPrecondition));
  EXPECT_TRUE(store_->Allocate(s, Spec(1, 2, 8), "a").ok());  // the arena is all for pages
}

}  // namespace
}  // namespace kvarena
