// A session id is a credential (docs/trust.md): the client library's messages, the
// demo's output and kvarenad's log show at most SessionIdForLog's 8-character prefix.
#include <signal.h>
#include <sys/wait.h>

#include <regex>

#include "kvarena/client.h"
#include "tests/daemon/rpc_test_util.h"
#include "tests/support/status_matchers.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Session ids are 32 hex digits; nothing else kvarena prints is.
bool HasWholeSessionId(const std::string& text) {
  return std::regex_search(text, std::regex("[0-9a-f]{32}"));
}

TEST(SessionIdForLogTest, KeepsEightCharacters) {
  EXPECT_EQ(SessionIdForLog("0123456789abcdef0123456789abcdef"), "01234567\u2026");
  EXPECT_EQ(SessionIdForLog(""), "");
}

TEST(SessionRedactionTest, DisconnectedErrorShowsOnlyAPrefix) {
  DaemonProcess d({});
  ASSERT_TRUE(d.WaitServing()) << d.Log();
  absl::StatusOr<std::shared_ptr<Client>> client = Client::Connect(d.address());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string id = (*client)->session_id();
  ASSERT_TRUE(HasWholeSessionId(id)) << id;

  d.Signal(SIGKILL);
  ASSERT_TRUE(d.WaitExit(absl::Seconds(10)).has_value());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while ((*client)->connected() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_FALSE((*client)->connected());
  const absl::Status s = (*client)->Ping();
  EXPECT_THAT(s, testing::StatusIs(absl::StatusCode::kUnavailable));
  const std::string message(s.message());
  EXPECT_THAT(message, HasSubstr("session " + SessionIdForLog(id) + " and its caches are gone"));
  EXPECT_THAT(message, Not(HasSubstr(id)));
  EXPECT_FALSE(HasWholeSessionId(d.Log())) << d.Log();
}

TEST(SessionRedactionTest, DemoAndDaemonLogShowNoWholeSessionId) {
  DaemonProcess d({});
  ASSERT_TRUE(d.WaitServing()) << d.Log();
  std::string out;
  const int status = RunCommand(
      {KVARENA_DEMO_PATH, "--address=" + d.address(), "--prefill=8", "--decode=2"}, &out);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("session [0-9a-f]{8}\u2026\n"))) << out;
  EXPECT_FALSE(HasWholeSessionId(out)) << out;
  d.Signal(SIGTERM);
  ASSERT_TRUE(d.WaitExit(absl::Seconds(10)).has_value());
  EXPECT_FALSE(HasWholeSessionId(d.Log())) << d.Log();
}

}  // namespace
}  // namespace kvarena
