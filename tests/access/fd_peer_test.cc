// The fd socket's peer rule (CheckFdPeer): the rule alone, and through the real kvarenad
// with a peer of another uid (kvarena_fd_peer as nobody:nogroup, the sockets' group, so
// the file mode lets it connect and only SO_PEERCRED decides). The process tests need
// root; they skip otherwise.
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <regex>

#include "daemon/socket_access.h"
#include "kvarena/client.h"
#include "tests/daemon/rpc_test_util.h"
#include "tests/support/status_matchers.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;

constexpr uid_t kNobody = 65534;

TEST(CheckFdPeerTest, WithoutAListTheDaemonsUidAndRootPass) {
  EXPECT_TRUE(CheckFdPeer(1000, 1000, {}).ok());
  EXPECT_TRUE(CheckFdPeer(0, 1000, {}).ok());
  const absl::Status other = CheckFdPeer(1001, 1000, {});
  EXPECT_THAT(other, testing::StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(std::string(other.message()), HasSubstr("peer uid 1001"));
}

TEST(CheckFdPeerTest, AListAdmitsExactlyItsUidsAndTheDaemonsOwn) {
  const std::vector<uid_t> list = {1001, 1002};
  EXPECT_TRUE(CheckFdPeer(1000, 1000, list).ok());
  EXPECT_TRUE(CheckFdPeer(1001, 1000, list).ok());
  EXPECT_TRUE(CheckFdPeer(1002, 1000, list).ok());
  const absl::Status root = CheckFdPeer(0, 1000, list);
  EXPECT_THAT(root, testing::StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(std::string(root.message()), HasSubstr("--allowed_uids=1001,1002"));
  EXPECT_TRUE(CheckFdPeer(0, 1000, {0, 1001}).ok());
  EXPECT_FALSE(CheckFdPeer(1003, 1000, list).ok());
}

struct Knock {
  int code = -1;
  int fds = -1;
  std::string line;
};

class FdPeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run a peer as another uid";
  }
  // kvarenad with `flags`, its sockets in group nogroup, and a session opened by a client
  // of kvarenad's own uid.
  void Start(std::vector<std::string> flags) {
    flags.push_back("--socket_group=nogroup");
    daemon_ = std::make_unique<DaemonProcess>(std::move(flags));
    ASSERT_TRUE(daemon_->WaitServing()) << daemon_->Log();
    ASSERT_EQ(chmod(daemon_->dir().c_str(), 0711), 0);  // others may reach the sockets
    absl::StatusOr<std::shared_ptr<Client>> c = Client::Connect(daemon_->address());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
  }
  // The session's regions, asked for by uid (and nogroup) over the fd socket.
  Knock KnockAs(uid_t uid) const {
    const group* g = getgrnam("nogroup");
    std::string out;
    RunCommand({KVARENA_FD_PEER_PATH, std::to_string(uid),
                std::to_string(g != nullptr ? g->gr_gid : 65534), "fds",
                daemon_->socket_path() + ".fds", client_->session_id()},
               &out);
    Knock k;
    k.line = out;
    std::smatch m;
    if (std::regex_search(out, m, std::regex("code=(\\d+) regions=\\d+ fds=(\\d+)"))) {
      k.code = std::stoi(m[1]);
      k.fds = std::stoi(m[2]);
    }
    return k;
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::shared_ptr<Client> client_;
};

TEST_F(FdPeerTest, AnotherUidIsRefusedByDefault) {
  Start({});
  const Knock k = KnockAs(kNobody);
  EXPECT_EQ(k.code, int(absl::StatusCode::kPermissionDenied)) << k.line;
  EXPECT_EQ(k.fds, 0) << k.line;
  EXPECT_THAT(k.line, HasSubstr("peer uid 65534 is neither kvarenad's uid 0 nor root"));
}

TEST_F(FdPeerTest, AListedUidGetsTheSessionsFds) {
  Start({"--allowed_uids=65534"});
  const Knock k = KnockAs(kNobody);
  EXPECT_EQ(k.code, 0) << k.line;
  EXPECT_GT(k.fds, 0) << k.line;
}

TEST_F(FdPeerTest, AnUnlistedUidStaysRefusedWhileTheDaemonsOwnIsServed) {
  Start({"--allowed_uids=4242"});
  const Knock nobody = KnockAs(kNobody);
  EXPECT_EQ(nobody.code, int(absl::StatusCode::kPermissionDenied)) << nobody.line;
  EXPECT_THAT(nobody.line, HasSubstr("--allowed_uids=4242"));
  const Knock own = KnockAs(geteuid());
  EXPECT_EQ(own.code, 0) << own.line;
  EXPECT_GT(own.fds, 0) << own.line;
}

}  // namespace
}  // namespace kvarena
