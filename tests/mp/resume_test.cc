// The restart story: a client whose Attach stream broke resumes its session with the
// resume token and keeps its caches (over a Unix socket and over TCP); when it cannot
// reach the daemon within the grace, the session and its caches are gone. The streams are
// broken for real, by a StreamProxy between the client and kvarenad closing the
// connections. Waits end on the event they wait for; nothing asserts a duration.
#include <signal.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon/daemon_process.h"  // PickUnusedPort
#include "tests/mp/mp_fixture.h"
#include "tests/mp/stream_proxy.h"
#include "tests/support/kv_history.h"
#include "tests/support/status_matchers.h"

namespace kvarena::testing {
namespace {

using ::testing::HasSubstr;

class ResumeTest : public MultiProcessTest {
 protected:
  // kvarenad on the fixture's Unix socket and, with tcp, on a 127.0.0.1 port; a proxy in
  // front of one of them.
  void Start(const std::string& grace, bool tcp) {
    const std::string socket = std::string(absl::StripPrefix(address(), "unix:"));
    const std::string daemon_tcp = absl::StrCat("127.0.0.1:", PickUnusedPort());
    StartDaemonWith(
        {"--session_grace=" + grace, tcp ? absl::StrCat("--listen=unix:", socket, ",", daemon_tcp)
                                         : "--listen=unix:" + socket});
    auto proxy = tcp ? StreamProxy::Start("127.0.0.1:0", daemon_tcp)
                     : StreamProxy::Start(absl::StrCat("unix:", dir(), "/proxy.sock"), address());
    ASSERT_TRUE(proxy.ok()) << proxy.status();
    proxy_ = *std::move(proxy);
  }

  // Appends n random tokens to layer 0.
  void AppendTokens(GenericKvCacheHandle& cache, int64_t n) {
    HostTensor k = RandomTensor(rng_, DType::kFloat32, 2, n, 16);
    HostTensor v = RandomTensor(rng_, DType::kFloat32, 2, n, 16);
    ASSERT_THAT(cache.append(0, k.arg(), v.arg()).status(), IsOk());
  }
  static bool WaitFor(const std::function<bool()>& done) {
    for (const absl::Time deadline = absl::Now() + kEventBound; absl::Now() < deadline;
         absl::SleepFor(absl::Milliseconds(5))) {
      if (done()) return true;
    }
    return false;
  }

  std::unique_ptr<StreamProxy> proxy_;
  std::mt19937_64 rng_{seed_};
};

TEST_F(ResumeTest, OverAUnixSocketTheSessionAndItsCachesSurviveABrokenStream) {
  Start("1h", /*tcp=*/false);
  auto client = Client::Connect(proxy_->address());
  ASSERT_THAT(client, IsOk());
  const std::string session = (*client)->session_id();
  auto cache = (*client)->Allocate(SmallSpec());
  ASSERT_THAT(cache, IsOk());
  AppendTokens(**cache, 20);
  auto before = (*cache)->get_kv(0);
  ASSERT_THAT(before, IsOk());

  proxy_->Cut();
  ASSERT_TRUE(WaitFor([&] { return (*client)->resumes() == 1; })) << daemon().output();
  EXPECT_TRUE((*client)->connected());
  EXPECT_EQ((*client)->session_id(), session);
  EXPECT_TRUE((*cache)->is_valid());
  EXPECT_EQ(Observer()->Stats()->num_sessions, 1);

  // The same bytes; and the session works on: appends, allocates, releases.
  auto after = (*cache)->get_kv(0);
  ASSERT_THAT(after, IsOk());
  EXPECT_EQ(after->k.data, before->k.data);
  EXPECT_EQ(after->v.data, before->v.data);
  AppendTokens(**cache, 3);
  EXPECT_THAT((*client)->Allocate(SmallSpec()), IsOk());
  EXPECT_THAT((*client)->Release((*cache)->cache_id()), IsOk());
}

// Each resume rotates the token: the client must present the newest one at the next.
TEST_F(ResumeTest, ASecondBreakResumesWithTheTokenTheFirstResumeGave) {
  Start("1h", /*tcp=*/false);
  auto client = Client::Connect(proxy_->address());
  ASSERT_THAT(client, IsOk());
  auto cache = (*client)->Allocate(SmallSpec());
  ASSERT_THAT(cache, IsOk());
  AppendTokens(**cache, 4);
  for (int64_t resumes = 1; resumes <= 2; ++resumes) {
    proxy_->Cut();
    ASSERT_TRUE(
        WaitFor([&] { return (*client)->resumes() == resumes || !(*client)->connected(); }));
    ASSERT_EQ((*client)->resumes(), resumes) << daemon().output();
    EXPECT_TRUE((*client)->connected());
  }
  EXPECT_TRUE((*cache)->is_valid());
  AppendTokens(**cache, 1);
}

TEST_F(ResumeTest, OverTcpTheClientRetriesUntilTheProxyForwardsAgain) {
  Start("1h", /*tcp=*/true);
  auto client = Client::Connect(proxy_->address());
  ASSERT_THAT(client, IsOk());
  auto cache = (*client)->Allocate(SmallSpec());
  ASSERT_THAT(cache, IsOk());
  AppendTokens(**cache, 5);
  auto before = (*cache)->get_kv(0);
  ASSERT_THAT(before, IsOk());

  // Refused twice first: each refused attempt is a connection the proxy closes at once.
  proxy_->SetRefusing(true);
  proxy_->Cut();
  ASSERT_TRUE(WaitFor([&] { return proxy_->refused() >= 2; }));
  EXPECT_TRUE((*client)->connected());  // still trying: the grace is an hour
  proxy_->SetRefusing(false);
  ASSERT_TRUE(WaitFor([&] { return (*client)->resumes() == 1; })) << daemon().output();
  EXPECT_TRUE((*client)->connected());
  auto after = (*cache)->get_kv(0);
  ASSERT_THAT(after, IsOk());
  EXPECT_EQ(after->k.data, before->k.data);
  AppendTokens(**cache, 1);
}

TEST_F(ResumeTest, PastTheGraceTheSessionAndItsCachesAreGone) {
  Start("1s", /*tcp=*/true);
  auto client = Client::Connect(proxy_->address());
  ASSERT_THAT(client, IsOk());
  auto cache = (*client)->Allocate(SmallSpec());
  ASSERT_THAT(cache, IsOk());
  AppendTokens(**cache, 5);
  ASSERT_GT(Observer()->Stats()->pages.pages_used, 0);

  proxy_->SetRefusing(true);
  proxy_->Cut();
  // The daemon releases the cache once the grace is over; the client gives up retrying.
  EXPECT_TRUE(WaitForArena([](const ArenaStats& s) {
    return s.num_sessions == 0 && s.pages.pages_used == 0;
  })) << daemon().output();
  ASSERT_TRUE(WaitFor([&] { return !(*client)->connected(); }));
  proxy_->SetRefusing(false);
  EXPECT_EQ((*client)->resumes(), 0);
  EXPECT_FALSE((*cache)->is_valid());
  const absl::Status s = (*client)->Ping();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(s.message()), HasSubstr("and its caches are gone"));
}

TEST_F(ResumeTest, WithResumeOffABrokenStreamDisconnectsForGood) {
  Start("1h", /*tcp=*/false);
  ClientOptions options;
  options.resume = false;
  auto client = Client::Connect(proxy_->address(), options);
  ASSERT_THAT(client, IsOk());
  auto cache = (*client)->Allocate(SmallSpec());
  ASSERT_THAT(cache, IsOk());
  proxy_->Cut();
  ASSERT_TRUE(WaitFor([&] { return !(*client)->connected(); }));
  EXPECT_EQ((*client)->resumes(), 0);
  EXPECT_FALSE((*cache)->is_valid());
}

TEST_F(ResumeTest, ADaemonRestartedOnTheSocketIsNotResumed) {
  Start("1h", /*tcp=*/false);
  auto client = Client::Connect(address());  // no proxy: the daemon itself goes away
  ASSERT_THAT(client, IsOk());
  auto cache = (*client)->Allocate(SmallSpec());
  ASSERT_THAT(cache, IsOk());
  daemon().Signal(SIGKILL);
  ASSERT_TRUE(daemon().Wait(kEventBound).ok());
  StartDaemon("1h");
  ASSERT_TRUE(WaitFor([&] { return !(*client)->connected(); }));
  EXPECT_EQ((*client)->resumes(), 0);
  EXPECT_FALSE((*cache)->is_valid());
  EXPECT_EQ(Observer()->Stats()->num_sessions, 0);
}

}  // namespace
}  // namespace kvarena::testing
