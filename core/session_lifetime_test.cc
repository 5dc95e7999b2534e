// Sessions on KvStore: a session's caches are its own, a detached session's caches go
// after its grace period, and the session counters follow open, detach and reap.
#include "core/store_fixture.h"

namespace kvarena {
namespace {

using Code = absl::StatusCode;

TEST_F(StoreTest, SessionsOwnTheirCaches) {
  const std::string s1 = *store_->OpenSession("w1");
  const std::string s2 = *store_->OpenSession("w2");
  EXPECT_EQ(s1.size(), 32u);
  EXPECT_NE(s1, s2);
  auto info = store_->Allocate(s1, Spec(1, 2, 8), "mine");
  ASSERT_TRUE(info.ok());
  OwnedTensor k = RandomTensor(rng_, DType::kFloat32, 2, 1, 8);
  EXPECT_THAT(store_->Append(s2, "mine", 0, 0, k.Arg(), k.Arg()),
              StatusIs(Code::kPermissionDenied));
  EXPECT_THAT(store_->Append("", "mine", 0, 0, k.Arg(), k.Arg()),
              StatusIs(Code::kPermissionDenied));
  EXPECT_THAT(store_->Release(s2, "mine"), StatusIs(Code::kPermissionDenied));
  EXPECT_TRUE(store_->CacheStats("mine").ok());  // operators may read stats
  EXPECT_TRUE(store_->Append(s1, "mine", 0, 0, k.Arg(), k.Arg()).ok());
  EXPECT_THAT(store_->Allocate("bogus", Spec(1, 2, 8), ""), StatusIs(Code::kFailedPrecondition));
}

TEST_F(StoreTest, DetachedSessionsReleaseAfterGrace) {
  const std::string s1 = *store_->OpenSession("w1");
  ASSERT_TRUE(store_->Allocate(s1, Spec(1, 2, 8), "a").ok());
  OwnedTensor k = RandomTensor(rng_, DType::kFloat32, 2, 9, 8);
  ASSERT_TRUE(store_->Append(s1, "a", 0, 0, k.Arg(), k.Arg()).ok());
  store_->DetachSession(s1, absl::Seconds(5));
  EXPECT_FALSE(store_->HasSession(s1));
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(store_->Reap(), 0);
  EXPECT_EQ(PagesUsed(), 3);
  clock_.Advance(absl::Seconds(4));
  EXPECT_EQ(store_->Reap(), 1);
  EXPECT_EQ(PagesUsed(), 0);
  EXPECT_EQ(store_->Stats().num_sessions, 0);
}

TEST_F(StoreTest, SessionCountersFollowOpenDetachAndReap) {
  const std::string s1 = *store_->OpenSession("w1");
  const std::string s2 = *store_->OpenSession("w2");
  ASSERT_TRUE(store_->Allocate(s1, Spec(1, 2, 8), "a").ok());
  ASSERT_TRUE(store_->Allocate(s1, Spec(1, 2, 8), "b").ok());
  store_->DetachSession(s1, absl::Seconds(5));
  store_->DetachSession(s1, absl::Seconds(5));  // once is what counts
  store_->DetachSession("unknown", absl::Seconds(5));
  ArenaStats st = store_->Stats();
  EXPECT_EQ(st.num_sessions, 2);
  EXPECT_EQ(st.sessions_in_grace, 1);
  EXPECT_EQ(st.sessions_opened, 2u);
  EXPECT_EQ(st.sessions_detached, 1u);
  EXPECT_EQ(st.sessions_reaped, 0u);
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(store_->Reap(), 2);
  st = store_->Stats();
  EXPECT_EQ(st.num_sessions, 1);
  EXPECT_EQ(st.sessions_in_grace, 0);
  EXPECT_EQ(st.sessions_reaped, 1u);
  EXPECT_EQ(st.caches_reaped_grace, 2u);
  EXPECT_EQ(st.caches_reaped_idle, 0u);
  EXPECT_TRUE(store_->HasSession(s2));
}

}  // namespace
}  // namespace kvarena
