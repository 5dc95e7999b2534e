#include "arena/fd_passing.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace kvarena {
namespace {

class FdPassingTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv_), 0); }
  void TearDown() override {
    close(sv_[0]);
    close(sv_[1]);
  }
  int sv_[2];
};

TEST_F(FdPassingTest, BytesAndFdsArriveTogether) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  ASSERT_TRUE(SendMessage(sv_[0], "hello", {pipefd[1]}).ok());
  auto m = RecvMessage(sv_[1]);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->bytes, "hello");
  ASSERT_EQ(m->fds.size(), 1u);
  // The received fd is a new descriptor for the same pipe.
  ASSERT_EQ(write(m->fds[0], "x", 1), 1);
  char c = 0;
  ASSERT_EQ(read(pipefd[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  EXPECT_NE(fcntl(m->fds[0], F_GETFD) & FD_CLOEXEC, 0);
  close(m->fds[0]);
  close(pipefd[0]);
  close(pipefd[1]);
}

TEST_F(FdPassingTest, MessagesKeepTheirBoundaries) {
  ASSERT_TRUE(SendMessage(sv_[0], "one").ok());
  ASSERT_TRUE(SendMessage(sv_[0], std::string(100000, 'z')).ok());
  EXPECT_EQ(RecvMessage(sv_[1])->bytes, "one");
  EXPECT_EQ(RecvMessage(sv_[1])->bytes.size(), 100000u);
}

TEST_F(FdPassingTest, ClosedPeerIsUnavailable) {
  close(sv_[0]);
  sv_[0] = open("/dev/null", O_RDONLY);
  EXPECT_EQ(RecvMessage(sv_[1]).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(FdPassingTest, PeerCredentialsNameThisProcess) {
  auto c = PeerCredentials(sv_[1]);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pid, getpid());
  EXPECT_EQ(c->uid, getuid());
}

TEST_F(FdPassingTest, TooManyFdsAreRefused) {
  std::vector<int> fds(kMaxFdsPerMessage + 1, 0);
  EXPECT_EQ(SendMessage(sv_[0], "x", fds).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvarena
