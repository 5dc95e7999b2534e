// Owners' bounds (StoreOptions::owners, the daemon's per-tenant max_caches / max_pages):
// an owner's sessions and sessionless caches count together; a call that would pass a
// bound is RESOURCE_EXHAUSTED naming the owner, the bound and the caller's numbers, and
// changes nothing; another owner is served meanwhile.
#include <string>
#include <vector>

#include "core/refusal.h"
#include "core/store_fixture.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;

class OwnerQuotaTest : public StoreTest {
 protected:
  void SetUp() override {
    StoreOptions o = Options(size_t{64} << 20);
    o.owners["a"] = OwnerBounds{/*max_caches=*/3, /*max_pages=*/4};
    o.owners["b"] = OwnerBounds{};  // listed without bounds
    MakeStore(o);
    SessionPeer peer;
    peer.owner = "a";
    session_ = store_->AttachSession("w", "", peer)->session_id;
  }
  // A one-layer cache (page 4) of owner a: in its session, or sessionless.
  absl::Status AllocA(const std::string& id, bool in_session) {
    return store_->Allocate(in_session ? session_ : "", Spec(1, 2, 8), id, {}, "a").status();
  }
  absl::Status Fill(const std::string& session, const std::string& id, int64_t pos, int64_t n) {
    OwnedTensor k = RandomTensor(rng_, DType::kFloat32, 2, n, 8);
    return store_->Append(session, id, 0, pos, k.Arg(), k.Arg()).status();
  }

  std::string session_;
};

TEST_F(OwnerQuotaTest, MaxCachesCountsTheOwnersSessionsAndSessionlessCachesTogether) {
  ASSERT_TRUE(AllocA("s1", true).ok());
  ASSERT_TRUE(AllocA("s2", true).ok());
  ASSERT_TRUE(AllocA("n1", false).ok());
  for (bool in_session : {true, false}) {
    const absl::Status s = AllocA("x", in_session);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
    EXPECT_EQ(s.message(), "allocate: tenant 'a' holds 3 caches; its max_caches=3");
    EXPECT_EQ(RefusalOf(s), Refusal::kTenantMaxCaches);
  }
  EXPECT_THAT(store_->Fork("", "n1", "x"), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(store_->Stats().num_caches, 3);
  // Other owners (listed or not) are served meanwhile.
  EXPECT_TRUE(store_->Allocate("", Spec(1, 2, 8), "b1", {}, "b").ok());
  EXPECT_TRUE(store_->Allocate("", Spec(1, 2, 8), "z1", {}, "").ok());
  // Releasing one gives its count back.
  ASSERT_TRUE(store_->Release("", "n1").ok());
  EXPECT_TRUE(AllocA("x", true).ok());
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();
}

TEST_F(OwnerQuotaTest, MaxPagesRefusesAppendReserveAndForkChangingNothing) {
  ASSERT_TRUE(AllocA("n1", false).ok());
  ASSERT_TRUE(Fill("", "n1", 0, 12).ok());  // 3 pages, sessionless
  ASSERT_TRUE(AllocA("s1", true).ok());
  const Snapshot n1 = Snap("n1");
  const int64_t used = PagesUsed();

  // Append of 8 tokens in the session: 2 more pages, past a's 4 in all.
  absl::Status s = Fill(session_, "s1", 0, 8);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(s.message(),
            "append: layer 0 needs 2 page(s) but tenant 'a' holds 3 pages; its max_pages=4");
  EXPECT_EQ(RefusalOf(s), Refusal::kTenantMaxPages);

  s = store_->Reserve(session_, {CacheTokens{"s1", 8}}).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(s.message(), "reserve: needs 2 page(s) but tenant 'a' holds 3 pages; its max_pages=4");
  EXPECT_EQ(RefusalOf(s), Refusal::kTenantMaxPages);

  // A fork holds every page it shares: 3 more.
  s = store_->Fork("", "n1", "f").status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(
      std::string(s.message()),
      HasSubstr("holds 3 page(s) to share or copy but tenant 'a' holds 3 pages; its max_pages=4"));
  EXPECT_EQ(RefusalOf(s), Refusal::kTenantMaxPages);

  // Nothing changed: no page, no length, no cache.
  EXPECT_EQ(PagesUsed(), used);
  EXPECT_EQ(Snap("n1"), n1);
  EXPECT_EQ(store_->Describe(session_, "s1")->info.seq_len, 0);
  EXPECT_EQ(store_->Stats().num_caches, 2);
  EXPECT_THAT(store_->Describe("", "f"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();

  // The last page fits; another owner is served past a's bound.
  EXPECT_TRUE(Fill(session_, "s1", 0, 4).ok());
  ASSERT_TRUE(store_->Allocate("", Spec(1, 2, 8), "b1", {}, "b").ok());
  OwnedTensor k = RandomTensor(rng_, DType::kFloat32, 2, 40, 8);
  EXPECT_TRUE(store_->Append("", "b1", 0, 0, k.Arg(), k.Arg()).ok());
  // Giving pages back makes room again.
  ASSERT_TRUE(store_->Release("", "n1").ok());
  EXPECT_TRUE(Fill(session_, "s1", 4, 8).ok());
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();
}

TEST_F(OwnerQuotaTest, AdoptedPrefixPagesCountAgainstTheAdoptingOwner) {
  CacheSpec spec = Spec(1, 2, 8);
  spec.prefix_namespace = "m";
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  AllocateOptions with_prompt;
  with_prompt.prompt_tokens = prompt;
  ASSERT_TRUE(store_->Allocate("", spec, "p1", with_prompt, "a").ok());
  ASSERT_TRUE(Fill("", "p1", 0, 9).ok());  // 3 pages; the 2 full ones registered
  // A second cache adopts the 2 full pages: a holds 5 page slots > 4, so it adopts none.
  absl::StatusOr<CacheInfo> p2 = store_->Allocate("", spec, "p2", with_prompt, "a");
  ASSERT_TRUE(p2.ok()) << p2.status();
  EXPECT_EQ(p2->cached_tokens, 0);
  ASSERT_TRUE(store_->Release("", "p2").ok());
  // With one page of room less held (p1 popped to 8 tokens: 2 pages), it adopts both.
  ASSERT_EQ(store_->Popn("", "p1", 1)->popped, 1);
  p2 = store_->Allocate("", spec, "p2", with_prompt, "a");
  ASSERT_TRUE(p2.ok()) << p2.status();
  EXPECT_EQ(p2->cached_tokens, 8);
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();
}

}  // namespace
}  // namespace kvarena
