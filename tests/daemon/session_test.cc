// Attach sessions: ownership (PERMISSION_DENIED) and the grace period after a stream breaks.
// Nothing here asserts a duration or sleeps to show that something did not happen: each
// test waits for the event it checks (a detached session, a released cache), and shows a
// cache was kept by the order of events or by a grace that cannot run out meanwhile.
#include <signal.h>

#include <functional>

#include "absl/time/clock.h"
#include "proto/wire.h"
#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using grpc::StatusCode;

class SessionTest : public KvarenadTest {
 protected:
  void SetUp() override {
    StartDaemon({"--arena_bytes=16Mi", "--session_grace=1s", "--scratch_bytes=2Mi"});
  }

  // Waits until the daemon has seen the session's stream end: a call made in it (a
  // Describe of cache_id, which it may read) is refused as detached.
  bool WaitUntilDetached(const std::string& session, const std::string& cache_id) {
    v1::DescribeRequest req;
    req.set_cache_id(cache_id);
    for (const absl::Time deadline = absl::Now() + kBound; absl::Now() < deadline;
         absl::SleepFor(absl::Milliseconds(10))) {
      v1::DescribeResponse resp;
      const grpc::Status s = stub_->Describe(Ctx(session).get(), req, &resp);
      if (s.error_code() == StatusCode::FAILED_PRECONDITION &&
          s.error_message().find("detached") != std::string::npos) {
        return true;
      }
    }
    return false;
  }
  // Polls Stats until done(stats) holds.
  bool WaitForArena(const std::function<bool(const v1::StatsResponse&)>& done) {
    for (const absl::Time deadline = absl::Now() + kBound; absl::Now() < deadline;
         absl::SleepFor(absl::Milliseconds(10))) {
      if (done(Stats())) return true;
    }
    return false;
  }

  // Only a failure guard: each wait ends as soon as what it waits for happens.
  static constexpr absl::Duration kBound = absl::Seconds(60);
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

// The grace is 1 h here: nothing can run out while the test watches, so what it sees is
// the daemon's rule (a detached session keeps its caches), not a race with a timer.
TEST_F(SessionTest, BrokenStreamKeepsTheSessionsCachesThroughItsGrace) {
  StartDaemon({"--arena_bytes=16Mi", "--session_grace=1h", "--scratch_bytes=2Mi"});
  grpc::ClientContext* stream = nullptr;
  const std::string session = Attach("doomed", &stream);
  const std::string id = Allocate(Spec(1, 1, 4), session);
  ASSERT_TRUE(AppendF32(id, 0, 0, 8, 1, 4, 1, session).ok());
  ASSERT_EQ(Stats().pages().pages_used(), 2u);

  stream->TryCancel();
  ASSERT_TRUE(WaitUntilDetached(session, id));
  const v1::StatsResponse st = Stats();
  EXPECT_EQ(st.num_sessions(), 1u) << "a session in its grace still counts";
  EXPECT_EQ(st.num_caches(), 1u);
  EXPECT_EQ(st.pages().pages_used(), 2u);
  EXPECT_EQ(Stats(id).pages().seq_len(), 8u);
}

TEST_F(SessionTest, BrokenStreamReleasesTheSessionsCachesAfterGrace) {
  grpc::ClientContext* stream = nullptr;
  const std::string session = Attach("doomed", &stream);
  const std::string id = Allocate(Spec(1, 1, 4), session);
  ASSERT_TRUE(AppendF32(id, 0, 0, 8, 1, 4, 1, session).ok());
  ASSERT_EQ(Stats().pages().pages_used(), 2u);

  stream->TryCancel();
  EXPECT_TRUE(WaitForArena([](const v1::StatsResponse& st) {
    return st.pages().pages_used() == 0 && st.num_caches() == 0 && st.num_sessions() == 0;
  })) << Stats().ShortDebugString();
  EXPECT_THAT(AppendF32(id, 0, 8, 1, 1, 4, 2, session), StatusIs(StatusCode::FAILED_PRECONDITION));
}

// Proven by order, not by waiting long enough: the bystander's stream breaks (and the
// daemon detaches it) before the doomed session's, so by the time the reaper has released
// the doomed session's cache the bystander's grace has run out too, and the reaper has
// seen the cache that belongs to no session.
TEST_F(SessionTest, CachesWithoutSessionOutliveBrokenStreams) {
  grpc::ClientContext* bystander_stream = nullptr;
  grpc::ClientContext* doomed_stream = nullptr;
  const std::string bystander = Attach("bystander", &bystander_stream);
  const std::string doomed = Attach("doomed", &doomed_stream);
  const std::string id = Allocate(Spec(1, 1, 4));
  ASSERT_TRUE(AppendF32(id, 0, 0, 4, 1, 4, 1).ok());
  const std::string doomed_id = Allocate(Spec(1, 1, 4), doomed);
  ASSERT_TRUE(AppendF32(doomed_id, 0, 0, 4, 1, 4, 1, doomed).ok());

  bystander_stream->TryCancel();
  ASSERT_TRUE(WaitUntilDetached(bystander, id));
  doomed_stream->TryCancel();
  ASSERT_TRUE(WaitForArena([](const v1::StatsResponse& st) { return st.num_caches() == 1; }))
      << Stats().ShortDebugString();
  EXPECT_EQ(Stats().num_sessions(), 0u);
  EXPECT_EQ(Stats(id).pages().seq_len(), 4u);
}

// A raw Attach stream with its first event.
struct RawStream {
  std::unique_ptr<grpc::ClientContext> ctx = std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> reader;
  v1::AttachEvent first;
  bool got_first = false;
};

RawStream OpenStream(const DaemonProcess& d, const std::string& resume_token) {
  RawStream r;
  v1::AttachRequest req;
  req.set_client_name("raw");
  req.set_resume_token(resume_token);
  r.reader = v1::KvCacheService::NewStub(d.NewChannel())->Attach(r.ctx.get(), req);
  r.got_first = r.reader->Read(&r.first);
  return r;
}

// The grace is 1 h: nothing runs out while the test watches.
TEST_F(SessionTest, AResumeTokenTakesTheSessionOverWithItsCaches) {
  StartDaemon({"--arena_bytes=16Mi", "--session_grace=1h", "--scratch_bytes=2Mi"});
  RawStream a = OpenStream(*daemon_, "");
  ASSERT_TRUE(a.got_first);
  const std::string session = a.first.session_id();
  EXPECT_EQ(a.first.resume_token().size(), 32u);
  EXPECT_NE(a.first.resume_token(), session);
  EXPECT_EQ(a.first.session_grace_ms(), 3600u * 1000);
  EXPECT_FALSE(a.first.resumed());
  const std::string id = Allocate(Spec(1, 1, 4), session);
  ASSERT_TRUE(AppendF32(id, 0, 0, 8, 1, 4, 1, session).ok());

  // Taken over while still attached: the old stream ends ABORTED.
  RawStream b = OpenStream(*daemon_, a.first.resume_token());
  ASSERT_TRUE(b.got_first);
  EXPECT_EQ(b.first.session_id(), session);
  EXPECT_TRUE(b.first.resumed());
  v1::AttachEvent more;
  while (a.reader->Read(&more)) {
  }
  EXPECT_THAT(a.reader->Finish(), StatusIs(StatusCode::ABORTED, "resumed by a newer Attach"));
  EXPECT_TRUE(Allocate(Spec(1, 1, 4), session).size() > 0);

  // Broken, then resumed from its grace with the token b was given (tokens rotate: a's
  // resumes nothing now): the cache is there and the session acts again.
  EXPECT_NE(b.first.resume_token(), a.first.resume_token());
  b.ctx->TryCancel();
  ASSERT_TRUE(WaitUntilDetached(session, id));
  RawStream c = OpenStream(*daemon_, b.first.resume_token());
  ASSERT_TRUE(c.got_first);
  EXPECT_EQ(c.first.session_id(), session);
  EXPECT_EQ(Stats(id).pages().seq_len(), 8u);
  EXPECT_TRUE(AppendF32(id, 0, 8, 1, 1, 4, 2, session).ok());
  EXPECT_EQ(Stats().num_sessions(), 1u);
  c.ctx->TryCancel();
  c.reader->Finish();
  b.reader->Finish();
}

TEST_F(SessionTest, AResumeTokenPastTheGraceIsNotFound) {
  RawStream a = OpenStream(*daemon_, "");
  ASSERT_TRUE(a.got_first);
  const std::string id = Allocate(Spec(1, 1, 4), a.first.session_id());
  a.ctx->TryCancel();
  a.reader->Finish();
  ASSERT_TRUE(WaitForArena([](const v1::StatsResponse& st) {
    return st.num_caches() == 0 && st.num_sessions() == 0;
  })) << Stats().ShortDebugString();
  RawStream late = OpenStream(*daemon_, a.first.resume_token());
  EXPECT_FALSE(late.got_first);
  EXPECT_THAT(late.reader->Finish(), StatusIs(StatusCode::NOT_FOUND, "resume_token"));
  RawStream bogus = OpenStream(*daemon_, std::string(64, 'f'));
  EXPECT_FALSE(bogus.got_first);
  EXPECT_THAT(bogus.reader->Finish(), StatusIs(StatusCode::NOT_FOUND));
  EXPECT_EQ(Stats().num_sessions(), 0u);
}

TEST_F(SessionTest, StreamsEndedByTheShutdownSaySo) {
  RawStream a = OpenStream(*daemon_, "");
  ASSERT_TRUE(a.got_first);
  daemon_->Signal(SIGTERM);
  v1::AttachEvent more;
  while (a.reader->Read(&more)) {
  }
  EXPECT_THAT(a.reader->Finish(), StatusIs(StatusCode::UNAVAILABLE, "shutting down"));
  const auto& trailers = a.ctx->GetServerTrailingMetadata();
  auto it = trailers.find(kAttachEndMetadataKey);
  ASSERT_NE(it, trailers.end());
  EXPECT_EQ(std::string(it->second.data(), it->second.size()), kAttachEndShutdown);
}

}  // namespace
}  // namespace kvarena
