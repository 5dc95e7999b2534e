// --socket_mode and --socket_group on every Unix socket kvarenad creates (the gRPC
// listeners and the fd socket), seen with stat(2) and by a process of another uid that
// tries to connect (kvarena_fd_peer, which drops to nobody:nogroup: tests run as root;
// they skip otherwise).
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_join.h"
#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;

constexpr uid_t kNobody = 65534;

gid_t NoGroup() {
  const group* g = getgrnam("nogroup");
  return g != nullptr ? g->gr_gid : gid_t(65534);
}

struct stat Stat(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st;
}

// What kvarena_fd_peer, as uid:gid, got from connect(2) to path.
std::string ConnectAs(uid_t uid, gid_t gid, const std::string& path) {
  std::string out;
  RunCommand({KVARENA_FD_PEER_PATH, std::to_string(uid), std::to_string(gid), "connect", path},
             &out);
  return out;
}

TEST(SocketAccessTest, DefaultIsOwnerAndGroupReadWriteOnBothSockets) {
  DaemonProcess d({});
  ASSERT_TRUE(d.WaitServing()) << d.Log();
  for (const std::string& path : {d.socket_path(), d.socket_path() + ".fds"}) {
    SCOPED_TRACE(path);
    const struct stat st = Stat(path);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777, 0660u);
    EXPECT_EQ(st.st_gid, getegid());
  }
}

TEST(SocketAccessTest, ModeAndGroupApplyToEverySocket) {
  TempDir dir;
  const std::string a = dir.path() + "/a.sock", b = dir.path() + "/b.sock";
  for (const std::string& group : {std::string("nogroup"), std::to_string(NoGroup())}) {
    SCOPED_TRACE(group);
    DaemonProcess d(
        {"--listen=unix:" + a + ",unix:" + b, "--socket_mode=0600", "--socket_group=" + group});
    ASSERT_TRUE(d.WaitServing()) << d.Log();
    for (const std::string& path : {a, b, a + ".fds"}) {
      SCOPED_TRACE(path);
      const struct stat st = Stat(path);
      EXPECT_EQ(st.st_mode & 07777, 0600u);
      EXPECT_EQ(st.st_gid, NoGroup());
    }
  }
}

TEST(SocketAccessTest, BadModeGroupOrUidsStopTheDaemonNamingTheFlag) {
  TempDir dir;
  const std::string listen = "--listen=unix:" + dir.path() + "/k.sock";
  const std::pair<std::string, std::string> cases[] = {
      {"--socket_mode=0999", "socket_mode"},
      {"--socket_mode=0460", "--socket_mode=0460 must lie within 0777 and include 0600"},
      {"--socket_mode=10660", "socket_mode"},
      {"--socket_group=kvarena-no-such-group",
       "--socket_group=kvarena-no-such-group: no such group"},
      {"--allowed_uids=12,abc", "allowed_uids"},
  };
  for (const auto& [flag, says] : cases) {
    SCOPED_TRACE(flag);
    std::string out;
    const int status = RunCommand({KVARENAD_PATH, "--backend=host", listen, flag}, &out);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
    EXPECT_THAT(out, HasSubstr(says));
  }
}

TEST(SocketAccessTest, OnlyTheSocketsGroupMayConnect) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a peer as nobody";
  DaemonProcess in_group({"--socket_group=nogroup"});
  DaemonProcess default_group({});
  for (DaemonProcess* d : {&in_group, &default_group}) {
    ASSERT_TRUE(d->WaitServing()) << d->Log();
    ASSERT_EQ(chmod(d->dir().c_str(), 0711), 0);  // nobody may reach the sockets' directory
  }
  EXPECT_THAT(ConnectAs(kNobody, NoGroup(), in_group.socket_path()), HasSubstr("connect: ok"));
  EXPECT_THAT(ConnectAs(kNobody, NoGroup(), in_group.socket_path() + ".fds"),
              HasSubstr("connect: ok"));
  EXPECT_THAT(ConnectAs(kNobody, NoGroup(), default_group.socket_path()),
              HasSubstr("Permission denied"));
  EXPECT_THAT(ConnectAs(kNobody, NoGroup(), default_group.socket_path() + ".fds"),
              HasSubstr("Permission denied"));
}

}  // namespace
}  // namespace kvarena
