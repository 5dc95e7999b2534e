// Reserve and Commit, the local path's two calls on KvStore: a reservation is all or
// nothing across caches, and a commit advances lengths only over reserved pages and never
// past max_tokens.
#include "core/store_fixture.h"

namespace kvarena {
namespace {

using Code = absl::StatusCode;

TEST_F(StoreTest, ReserveIsAllOrNothingAcrossCaches) {
  MakeStore(kChunkGranularity);  // 4096 pages of 512 bytes
  const std::string a = Alloc(Spec(2, 2, 8));
  const std::string b = Alloc(Spec(2, 2, 8, DType::kFloat32, {}, /*max_tokens=*/16));
  auto r = store_->Reserve("", {{a, 6}, {b, 6}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].layers[0].page_ids.size(), 2u);
  EXPECT_EQ(PagesUsed(), 8);
  const Snapshot before = Snap(a);
  EXPECT_THAT(store_->Reserve("", {{a, 100}, {b, 20}}), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(store_->Reserve("", {{a, 100000}, {b, 1}}), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(store_->Reserve("", {{a, 1}, {a, 1}}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(store_->Reserve("", {{a, 1}, {"nope", 1}}), StatusIs(Code::kNotFound));
  EXPECT_TRUE(Snap(a) == before);
  EXPECT_EQ(PagesUsed(), 8);
}

TEST_F(StoreTest, CommitAdvancesLengthsOverWrittenPages) {
  const std::string a = Alloc(Spec(2, 2, 8, DType::kFloat32, {0, 3}));
  EXPECT_THAT(store_->Commit("", {{a, 1}}), StatusIs(Code::kFailedPrecondition));
  ASSERT_TRUE(store_->Reserve("", {{a, 8}}).ok());
  auto c = store_->Commit("", {{a, 5}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0].seq_len, 5);
  EXPECT_EQ((*c)[0].layer_lens, (std::vector<int64_t>{5, 5}));
  ASSERT_TRUE(store_->Commit("", {{a, 3}}).ok());
  EXPECT_THAT(store_->Commit("", {{a, 1}}), StatusIs(Code::kFailedPrecondition));
  // Sliding layer 1 (w=3): after the block starting at 5, keys below 3 are dead.
  EXPECT_EQ(store_->Describe("", a)->layers[1].first_pos, 0);
  ASSERT_TRUE(store_->Reserve("", {{a, 4}}).ok());
  ASSERT_TRUE(store_->Commit("", {{a, 4}}).ok());
  EXPECT_EQ(store_->Describe("", a)->layers[1].first_pos, 4);
}

TEST_F(StoreTest, CommitStopsAtMaxTokensEvenInsideReservedPages) {
  const std::string a = Alloc(Spec(1, 2, 8, DType::kFloat32, {}, /*max_tokens=*/6));
  ASSERT_TRUE(store_->Reserve("", {{a, 6}}).ok());  // two pages of 4: room for 8
  EXPECT_THAT(store_->Commit("", {{a, 7}}), StatusIs(Code::kResourceExhausted));
  EXPECT_EQ(store_->Describe("", a)->info.seq_len, 0);
  EXPECT_TRUE(store_->Commit("", {{a, 6}}).ok());
}

}  // namespace
}  // namespace kvarena
