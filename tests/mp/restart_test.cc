// The daemon goes away under a connected client: the client learns it (UNAVAILABLE with a
// clear message, invalid handles), and a restarted daemon on the same socket serves a new
// client.
#include <signal.h>

#include <random>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/mp/mp_fixture.h"
#include "tests/support/kv_history.h"
#include "tests/support/status_matchers.h"

namespace kvarena::testing {
namespace {

using ::testing::HasSubstr;

class RestartTest : public MultiProcessTest {
 protected:
  absl::Status AppendOne(GenericKvCacheHandle& cache, int layer) {
    HostTensor k = RandomTensor(rng_, DType::kFloat32, 2, 1, 16);
    HostTensor v = RandomTensor(rng_, DType::kFloat32, 2, 1, 16);
    return cache.append(layer, k.arg(), v.arg()).status();
  }
  std::mt19937_64 rng_{seed_};
};

TEST_F(RestartTest, SigtermMakesClientUnavailableAndRestartServesNewClient) {
  StartDaemon();
  auto client = Client::Connect(address());
  ASSERT_THAT(client, IsOk());
  EXPECT_FALSE((*client)->session_id().empty());
  auto cache = (*client)->Allocate(SmallSpec());
  ASSERT_THAT(cache, IsOk());
  ASSERT_THAT(AppendOne(**cache, 0), IsOk());
  EXPECT_TRUE((*cache)->is_valid());

  daemon().Signal(SIGTERM);
  auto exit_status = daemon().Wait(kEventBound);
  ASSERT_TRUE(exit_status.ok()) << exit_status.status() << "\n" << daemon().output();
  EXPECT_EQ(DescribeWaitStatus(*exit_status), "exit 0") << daemon().output();

  absl::Status s = AppendOne(**cache, 0);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(s.message()), HasSubstr("kvarena daemon unavailable"));
  const absl::Time deadline = absl::Now() + kEventBound;
  while ((*cache)->is_valid() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_FALSE((*cache)->is_valid());
  EXPECT_FALSE((*client)->connected());
  EXPECT_THAT((*client)->Stats(), StatusIs(absl::StatusCode::kUnavailable));

  StartDaemon();
  auto fresh = Client::Connect(address());
  ASSERT_THAT(fresh, IsOk());
  EXPECT_NE((*fresh)->session_id(), (*client)->session_id());
  auto cache2 = (*fresh)->Allocate(SmallSpec());
  ASSERT_THAT(cache2, IsOk());
  EXPECT_THAT(AppendOne(**cache2, 1), IsOk());
  EXPECT_TRUE((*cache2)->is_valid());
  // The old client stays disconnected: its session died with the old daemon.
  EXPECT_THAT(AppendOne(**cache, 0), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT((*client)->Allocate(SmallSpec()), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(RestartTest, ConnectWithoutDaemonIsUnavailable) {
  ClientOptions options;
  options.connect_timeout = absl::Seconds(2);
  auto client = Client::Connect(address(), options);
  EXPECT_THAT(client, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("kvarena daemon unavailable"));
}

TEST_F(RestartTest, AnotherSessionsCacheIsPermissionDenied) {
  StartDaemon();
  auto a = Client::Connect(address());
  auto b = Client::Connect(address());
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  auto cache = (*a)->Allocate(SmallSpec(), "owned-by-a");
  ASSERT_THAT(cache, IsOk());
  EXPECT_THAT((*b)->OpenCache("owned-by-a"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT((*b)->Release("owned-by-a"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT((*a)->OpenCache("owned-by-a"), IsOk());
}

}  // namespace
}  // namespace kvarena::testing
