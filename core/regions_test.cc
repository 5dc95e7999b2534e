// The store's zero-copy side: which regions a session sees, exporting them, and slices.
#include <unistd.h>

#include "core/store_fixture.h"

namespace kvarena {
namespace {

using Code = absl::StatusCode;

class RegionsTest : public StoreTest {
 protected:
  std::unique_ptr<MappedRegion> Map(const std::string& session, const RegionInfo& r) {
    auto pieces = store_->ExportRegion(session, r.region_id);
    EXPECT_TRUE(pieces.ok()) << pieces.status();
    auto m = ImportRegion(r.kind, r.size, r.ipc_handle);
    EXPECT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE((*m)->MapPieces(*std::move(pieces)).ok());
    return *std::move(m);
  }
};

TEST_F(RegionsTest, SessionSeesItsScratchAndEveryPool) {
  const std::string s = *store_->OpenSession("w");
  ASSERT_TRUE(store_->Allocate(s, Spec(1, 2, 8), "a").ok());
  auto regions = store_->SessionRegions(s);
  ASSERT_TRUE(regions.ok());
  ASSERT_EQ(regions->size(), 2u);
  EXPECT_TRUE((*regions)[0].scratch);
  EXPECT_GE((*regions)[0].region_id, kScratchRegionBase);
  EXPECT_EQ((*regions)[1].region_id, 1u);
  EXPECT_EQ((*regions)[1].kind, "host_memfd");
  EXPECT_THAT(store_->SessionRegions(""), StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(store_->SessionRegions("feed"), StatusIs(Code::kFailedPrecondition));
}

TEST_F(RegionsTest, MappedPoolShowsWhatGetKvReturns) {
  const std::string s = *store_->OpenSession("w");
  ASSERT_TRUE(store_->Allocate(s, Spec(1, 2, 8), "a").ok());
  OwnedTensor k = RandomTensor(rng_, DType::kFloat32, 2, 6, 8);
  OwnedTensor v = RandomTensor(rng_, DType::kFloat32, 2, 6, 8);
  ASSERT_TRUE(store_->Append(s, "a", 0, 0, k.Arg(), v.Arg()).ok());
  const RegionInfo pool = (*store_->SessionRegions(s))[1];
  std::unique_ptr<MappedRegion> m = Map(s, pool);
  const CacheDescription d = *store_->Describe(s, "a");
  PagedKvView view = PagedKvView{};
  view.layout = PageLayout{DType::kFloat32, 4, 2, 8};
  view.pool_base = m->base();
  view.block_table = d.layers[0].page_ids.data();
  view.num_blocks = int64_t(d.layers[0].page_ids.size());
  view.len = d.layers[0].len;
  // Token 5, head 1, dim 3 of K, read through this process's own mapping.
  float got;
  std::memcpy(&got, view.TokenPtr(0, 5) + (1 * 8 + 3) * 4, 4);
  EXPECT_EQ(got, float(k.at(1, 5, 3)));
}

TEST_F(RegionsTest, ExportIsForTheSessionsOwnScratchOnly) {
  const std::string s1 = *store_->OpenSession("w1");
  const std::string s2 = *store_->OpenSession("w2");
  const uint64_t scratch1 = (*store_->SessionRegions(s1))[0].region_id;
  EXPECT_THAT(store_->ExportRegion(s2, scratch1), StatusIs(Code::kPermissionDenied));
  EXPECT_THAT(store_->ExportRegion("", scratch1), StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(store_->ExportRegion(s1, 7), StatusIs(Code::kNotFound));
  auto pieces = store_->ExportRegion(s1, scratch1);
  ASSERT_TRUE(pieces.ok());
  for (const SharedPiece& p : *pieces) close(p.fd);
}

TEST_F(RegionsTest, ExportAfterAGenerationGivesOnlyNewerPieces) {
  const std::string s = *store_->OpenSession("w");
  ASSERT_TRUE(store_->Allocate(s, Spec(1, 2, 8), "a").ok());
  auto all = store_->ExportRegion(s, 1);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  const uint64_t newest = (*all)[0].generation;
  close((*all)[0].fd);
  auto none = store_->ExportRegion(s, 1, newest);  // a host pool is one piece for life
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST_F(RegionsTest, SlicesResolveInsideTheScratchRegionOnly) {
  const std::string s1 = *store_->OpenSession("w1");
  const std::string s2 = *store_->OpenSession("w2");
  const RegionInfo scratch = (*store_->SessionRegions(s1))[0];
  std::unique_ptr<MappedRegion> m = Map(s1, scratch);
  m->base()[4096] = 77;  // the worker writes a tensor into its scratch region...
  auto slice = store_->ResolveSlice(s1, scratch.region_id, 4096, 16);
  ASSERT_TRUE(slice.ok());
  EXPECT_EQ(slice->data[0], 77);  // ...and the store reads it in place.
  EXPECT_THAT(store_->ResolveSlice(s1, scratch.region_id, scratch.size - 8, 16),
              StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(store_->ResolveSlice(s2, scratch.region_id, 0, 16),
              StatusIs(Code::kPermissionDenied));
  EXPECT_THAT(store_->ResolveSlice("", scratch.region_id, 0, 16),
              StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(store_->ResolveSlice(s1, 1, 0, 16), StatusIs(Code::kPermissionDenied));
}

}  // namespace
}  // namespace kvarena
