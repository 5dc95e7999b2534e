// Resuming a session (KvStore::AttachSession with a resume token) on the fake clock: within
// the grace it keeps the caches, at the end of the grace it is gone, and a stale
// attachment's detach does not end the attachment that resumed it.
#include <string>

#include "core/store_fixture.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;

class ResumeTest : public StoreTest {
 protected:
  // A session owning cache "a" with 9 tokens (3 pages of 4).
  SessionAttachment OpenWithCache() {
    absl::StatusOr<SessionAttachment> a = store_->AttachSession("w", "");
    EXPECT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(store_->Allocate(a->session_id, Spec(1, 2, 8), "a").ok());
    k_ = RandomTensor(rng_, DType::kFloat32, 2, 9, 8);
    EXPECT_TRUE(store_->Append(a->session_id, "a", 0, 0, k_.Arg(), k_.Arg()).ok());
    return *a;
  }
  // A Unix peer of tenant `owner`, which may hold at most max_sessions (0: any number).
  static SessionPeer Owner(const std::string& owner, int64_t max_sessions = 0) {
    SessionPeer p;
    p.owner = owner;
    p.owner_max_sessions = max_sessions;
    return p;
  }
  OwnedTensor k_;
};

TEST_F(ResumeTest, OpenGivesATokenApartFromTheId) {
  const SessionAttachment a = *store_->AttachSession("w", "");
  const SessionAttachment b = *store_->AttachSession("w", "");
  EXPECT_EQ(a.resume_token.size(), 32u);
  EXPECT_NE(a.resume_token, a.session_id);
  EXPECT_NE(a.resume_token, b.resume_token);
  EXPECT_EQ(a.epoch, 1u);
  EXPECT_FALSE(a.resumed);
}

TEST_F(ResumeTest, WithinTheGraceKeepsTheCachesAndTheQuota) {
  const SessionAttachment a = OpenWithCache();
  store_->DetachSession(a.session_id, absl::Seconds(5), a.epoch);
  EXPECT_FALSE(store_->HasSession(a.session_id));
  clock_.Advance(absl::Seconds(5) - absl::Nanoseconds(1));

  absl::StatusOr<SessionAttachment> r = store_->AttachSession("w", a.resume_token);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->session_id, a.session_id);
  EXPECT_EQ(r->epoch, 2u);
  EXPECT_TRUE(r->resumed);
  EXPECT_TRUE(store_->HasSession(a.session_id));
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(store_->Reap(), 0);
  EXPECT_EQ(PagesUsed(), 3);
  // The session acts again: its cache reads back and it may allocate.
  absl::StatusOr<GetKvResult> kv = store_->GetKv(a.session_id, "a", 0);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(kv->k.data, std::string(k_.bytes.begin(), k_.bytes.end()));
  EXPECT_TRUE(store_->Allocate(a.session_id, Spec(1, 2, 8), "b").ok());
}

TEST_F(ResumeTest, AtTheEndOfTheGraceItIsGone) {
  const SessionAttachment a = OpenWithCache();
  store_->DetachSession(a.session_id, absl::Seconds(5), a.epoch);
  clock_.Advance(absl::Seconds(5));
  // Not reaped yet, but its grace is over: resuming fails, and the reaper releases it.
  absl::StatusOr<SessionAttachment> late = store_->AttachSession("w", a.resume_token);
  EXPECT_THAT(late, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("resume_token"));
  EXPECT_EQ(store_->Reap(), 1);
  EXPECT_EQ(PagesUsed(), 0);
  EXPECT_THAT(store_->AttachSession("w", a.resume_token), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ResumeTest, UnknownTokensAndSessionIdsAreNotFound) {
  const SessionAttachment a = OpenWithCache();
  EXPECT_THAT(store_->AttachSession("w", a.session_id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->AttachSession("w", std::string(32, '0')),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->AttachSession("w", std::string(1 << 20, 'x')),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(store_->Stats().num_sessions, 1);
}

TEST_F(ResumeTest, TheStaleAttachmentsDetachIsANoOp) {
  const SessionAttachment a = OpenWithCache();
  // Resumed while the first attachment still holds it (its stream not yet seen to end).
  const SessionAttachment r = *store_->AttachSession("w", a.resume_token);
  store_->DetachSession(a.session_id, absl::Seconds(5), a.epoch);
  EXPECT_TRUE(store_->HasSession(a.session_id));
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(store_->Reap(), 0);
  EXPECT_EQ(PagesUsed(), 3);
  // The current attachment's detach counts.
  store_->DetachSession(a.session_id, absl::Seconds(5), r.epoch);
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(store_->Reap(), 1);
  EXPECT_EQ(PagesUsed(), 0);
}

TEST_F(ResumeTest, ResumingAgainAfterAnotherBreak) {
  const SessionAttachment a = OpenWithCache();
  uint64_t epoch = a.epoch;
  std::string token = a.resume_token;
  for (int i = 0; i < 3; ++i) {
    store_->DetachSession(a.session_id, absl::Seconds(5), epoch);
    clock_.Advance(absl::Seconds(4));
    absl::StatusOr<SessionAttachment> r = store_->AttachSession("w", token);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->epoch, epoch + 1);
    epoch = r->epoch;
    token = r->resume_token;
  }
  EXPECT_EQ(store_->Reap(), 0);
  EXPECT_EQ(PagesUsed(), 3);
}

// Each resume hands out a new token and retires the one it used: a stream taken over, or
// a token that leaked, cannot take the session back.
TEST_F(ResumeTest, EachResumeRotatesTheToken) {
  const SessionAttachment a = OpenWithCache();
  absl::StatusOr<SessionAttachment> r = store_->AttachSession("w", a.resume_token);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->resume_token.size(), 32u);
  EXPECT_NE(r->resume_token, a.resume_token);
  EXPECT_NE(r->resume_token, a.session_id);
  EXPECT_THAT(store_->AttachSession("w", a.resume_token), StatusIs(absl::StatusCode::kNotFound));
  // The new token works, once, and the session is still the same one.
  absl::StatusOr<SessionAttachment> again = store_->AttachSession("w", r->resume_token);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->session_id, a.session_id);
  EXPECT_EQ(again->epoch, 3u);
  EXPECT_THAT(store_->AttachSession("w", r->resume_token), StatusIs(absl::StatusCode::kNotFound));
  // A reaped session's newest token is gone with it.
  store_->DetachSession(a.session_id, absl::Seconds(5), again->epoch);
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(store_->Reap(), 1);
  EXPECT_THAT(store_->AttachSession("w", again->resume_token),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ResumeTest, OnlyItsOwnerResumesOrCountsASession) {
  const SessionAttachment a = *store_->AttachSession("w", "", Owner("alice", 1));
  EXPECT_TRUE(store_->SessionOwnedBy(a.session_id, "alice"));
  EXPECT_FALSE(store_->SessionOwnedBy(a.session_id, "bob"));
  EXPECT_FALSE(store_->SessionOwnedBy(a.session_id, ""));
  // Another owner's resume: as if no session held the token; the session is untouched.
  EXPECT_THAT(
      store_->AttachSession("w", a.resume_token, Owner("bob")),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("no session holds this resume_token")));
  EXPECT_THAT(store_->AttachSession("w", a.resume_token), StatusIs(absl::StatusCode::kNotFound));
  absl::StatusOr<SessionAttachment> r = store_->AttachSession("w", a.resume_token, Owner("alice"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->epoch, 2u);
  // alice's bound counts alice's sessions only.
  EXPECT_THAT(
      store_->AttachSession("w", "", Owner("alice", 1)),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("'alice' holds 1 sessions")));
  EXPECT_TRUE(store_->AttachSession("w", "", Owner("bob", 1)).ok());
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok());
}

}  // namespace
}  // namespace kvarena
