// popn: the all-or-nothing rollback rule of DESIGN.md, on global and sliding layers.
#include "core/store_fixture.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;

class PopnTest : public StoreTest {
 protected:
  // Appends n tokens to every layer, one step at a time (as a decode loop would).
  void Steps(const std::string& id, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      for (int l = 0; l < specs_[id].num_layers; ++l) ASSERT_TRUE(AppendRandom(id, l, 1).ok());
    }
  }
  void TruncateRefs(const std::string& id, int64_t new_len) {
    for (RefLayer& r : refs_[id]) {
      r.k.resize(size_t(std::min<int64_t>(new_len, int64_t(r.k.size()))));
      r.v.resize(r.k.size());
    }
  }
};

TEST_F(PopnTest, BeforeEvictionReturnsNAndFreesTrailingPages) {
  const std::string id = Alloc(Spec(2, 2, 8, DType::kFloat32, {0, 16}));
  Steps(id, 13);  // 4 pages per layer; the window of 16 has evicted nothing
  EXPECT_EQ(PagesUsed(), 8);
  auto r = store_->Popn("", id, 5);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->popped, 5);
  EXPECT_EQ(r->seq_len, 8);
  EXPECT_TRUE(r->refusal.empty());
  EXPECT_EQ(PagesUsed(), 4);  // 8 tokens = 2 pages per layer
  TruncateRefs(id, 8);
  ExpectAttendMatches(id, 0, 7, 1, 4);
  ExpectAttendMatches(id, 1, 7, 1, 4);
  Steps(id, 3);  // regrows over the rolled-back positions
  ExpectAttendMatches(id, 1, 10, 1, 4);
  EXPECT_EQ(store_->GetKv("", id, 0)->k.shape[2], 11);
}

TEST_F(PopnTest, AfterEvictionRefusesAndChangesNothing) {
  const std::string id = Alloc(Spec(2, 2, 8, DType::kFloat32, {0, 3}));
  Steps(id, 20);
  ASSERT_GT(store_->Describe("", id)->layers[1].first_pos, 0);
  const Snapshot before = Snap(id);
  auto r = store_->Popn("", id, 12);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->popped, 0);
  EXPECT_EQ(r->seq_len, 20);
  EXPECT_THAT(r->refusal, HasSubstr("layer 1"));
  Snapshot after = Snap(id);
  EXPECT_TRUE(after == before);
  EXPECT_EQ(after.cache.refusals, 1u);
}

TEST_F(PopnTest, SlidingLayerRollsBackWhatItStillHolds) {
  // The reference refuses once a sliding layer holds more than w-1 tokens; we keep whole
  // pages, so a rollback that stays inside what is retained succeeds.
  const std::string id = Alloc(Spec(1, 2, 8, DType::kFloat32, {5}));
  Steps(id, 30);
  const int64_t first = store_->Describe("", id)->layers[0].first_pos;
  const int64_t max_pop = 30 - (first + 5 - 1);  // next query at 30-n needs keys from 30-n-4
  ASSERT_GT(max_pop, 0);
  EXPECT_EQ(store_->Popn("", id, max_pop + 1)->popped, 0);
  EXPECT_EQ(store_->Popn("", id, max_pop)->popped, max_pop);
  TruncateRefs(id, 30 - max_pop);
  Steps(id, 1);
  ExpectAttendMatches(id, 0, 30 - max_pop, 1, 2);
}

TEST_F(PopnTest, ZeroIsANoOp) {
  const std::string id = Alloc(Spec(1, 2, 8));
  Steps(id, 3);
  const Snapshot before = Snap(id);
  auto r = store_->Popn("", id, 0);
  EXPECT_EQ(r->popped, 0);
  EXPECT_TRUE(r->refusal.empty());
  EXPECT_TRUE(Snap(id) == before);
}

TEST_F(PopnTest, MoreThanSeqLenIsRefused) {
  const std::string id = Alloc(Spec(1, 2, 8));
  Steps(id, 3);
  const Snapshot before = Snap(id);
  auto r = store_->Popn("", id, 4);
  EXPECT_EQ(r->popped, 0);
  EXPECT_EQ(r->refusal, "popn: n=4 but seq_len=3");
  EXPECT_TRUE(Snap(id) == before);
  // Every n past seq_len is a refusal, up to the largest the wire can carry.
  for (uint64_t n : {uint64_t{1} << 63, ~uint64_t{0}}) {
    auto huge = store_->Popn("", id, n);
    ASSERT_TRUE(huge.ok()) << huge.status();
    EXPECT_EQ(huge->popped, 0);
    EXPECT_EQ(huge->refusal, absl::StrCat("popn: n=", n, " but seq_len=3"));
  }
  EXPECT_TRUE(Snap(id) == before);
}

TEST_F(PopnTest, LaggingLayersLoseOnlyTheirShare) {
  const std::string id = Alloc(Spec(2, 2, 8));
  Steps(id, 6);
  ASSERT_TRUE(AppendRandom(id, 0, 2).ok());  // layer 0 ran ahead: 8 vs 6
  auto r = store_->Popn("", id, 3);
  ASSERT_EQ(r->popped, 3);
  EXPECT_EQ(store_->Describe("", id)->info.layer_lens, (std::vector<int64_t>{5, 5}));
}

}  // namespace
}  // namespace kvarena
