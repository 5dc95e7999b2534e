// Attach sessions: ownership (PERMISSION_DENIED) and the grace period after a stream breaks.
#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using grpc::StatusCode;

class SessionTest : public KvarenadTest {
 protected:
  void SetUp() override {
    StartDaemon({"--arena_bytes=16Mi", "--session_grace=1s", "--scratch_bytes=2Mi"});
  }
};

TEST_F(SessionTest, AttachNamesAnUnguessableSession) {
  const std::string a = Attach("worker-a");
  const std::string b = Attach("worker-b");
  EXPECT_GE(a.size(), 16u);
  EXPECT_NE(a, b);
  EXPECT_EQ(Stats().num_sessions(), 2u);
}

TEST_F(SessionTest, AnotherSessionTouchingTheCacheIsPermissionDenied) {
  const std::string owner = Attach("owner");
  const std::string intruder = Attach("intruder");
  const std::string id = Allocate(Spec(1, 1, 4), owner);
  ASSERT_TRUE(AppendF32(id, 0, 0, 3, 1, 4, 1, owner).ok());
  const std::string before = Snapshot(id, owner);

  EXPECT_THAT(AppendF32(id, 0, 3, 1, 1, 4, 2, intruder),
              StatusIs(StatusCode::PERMISSION_DENIED, "another session"));
  v1::PopnRequest popn;
  popn.set_cache_id(id);
  popn.set_n(1);
  v1::PopnResponse popped;
  EXPECT_THAT(stub_->Popn(Ctx(intruder).get(), popn, &popped),
              StatusIs(StatusCode::PERMISSION_DENIED));
  v1::ReleaseRequest release;
  release.set_cache_id(id);
  v1::ReleaseResponse released;
  EXPECT_THAT(stub_->Release(Ctx(intruder).get(), release, &released),
              StatusIs(StatusCode::PERMISSION_DENIED));
  EXPECT_THAT(stub_->Release(Ctx().get(), release, &released),  // no session at all
              StatusIs(StatusCode::PERMISSION_DENIED));
  v1::GetKvRequest get;
  get.set_cache_id(id);
  v1::GetKvResponse got;
  EXPECT_THAT(stub_->GetKv(Ctx(intruder).get(), get, &got),
              StatusIs(StatusCode::PERMISSION_DENIED));
  EXPECT_EQ(Snapshot(id, owner), before);
  EXPECT_EQ(Stats(id).pages().seq_len(), 3u);  // Stats is open to every caller
}

TEST_F(SessionTest, BrokenStreamReleasesTheSessionsCachesAfterGrace) {
  grpc::ClientContext* stream = nullptr;
  const std::string session = Attach("doomed", &stream);
  const std::string id = Allocate(Spec(1, 1, 4), session);
  ASSERT_TRUE(AppendF32(id, 0, 0, 8, 1, 4, 1, session).ok());
  ASSERT_EQ(Stats().pages().pages_used(), 2u);

  stream->TryCancel();
  const absl::Time broke = absl::Now();
  EXPECT_EQ(Stats().num_caches(), 1u) << "released before the grace ran out";
  while (Stats().pages().pages_used() != 0 && absl::Now() < broke + absl::Seconds(2)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(Stats().pages().pages_used(), 0u);  // within grace (1s) + 1s
  EXPECT_EQ(Stats().num_caches(), 0u);
  EXPECT_GE(absl::Now() - broke, absl::Milliseconds(900));
  EXPECT_THAT(AppendF32(id, 0, 8, 1, 1, 4, 2, session),
              StatusIs(StatusCode::FAILED_PRECONDITION));
}

TEST_F(SessionTest, CachesWithoutSessionOutliveBrokenStreams) {
  grpc::ClientContext* stream = nullptr;
  Attach("bystander", &stream);
  const std::string id = Allocate(Spec(1, 1, 4));
  ASSERT_TRUE(AppendF32(id, 0, 0, 4, 1, 4, 1).ok());
  stream->TryCancel();
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_EQ(Stats(id).pages().seq_len(), 4u);
}

}  // namespace
}  // namespace kvarena
