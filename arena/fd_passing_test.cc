#include "arena/fd_passing.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <iterator>
#include <vector>

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
  // This process's open fds.
  static int OpenFds() {
    namespace fs = std::filesystem;
    return int(std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator()));
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

// One message sent in two pieces, each carrying fds: the receiver holds none of them.
TEST_F(FdPassingTest, ReceiverRefusesMoreFdsThanOneMessageCarries) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const uint32_t len = 1;
  const char body = 'x';
  auto send_piece = [&](const void* bytes, size_t n, size_t num_fds) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)] = {};
    std::vector<int> fds(num_fds, pipefd[0]);
    iovec iov{const_cast<void*>(bytes), n};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * num_fds);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * num_fds);
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * num_fds);
    return sendmsg(sv_[0], &msg, 0) == ssize_t(n);
  };
  ASSERT_TRUE(send_piece(&len, sizeof(len), kMaxFdsPerMessage));
  ASSERT_TRUE(send_piece(&body, 1, 10));
  const int open_before = OpenFds();
  EXPECT_EQ(RecvMessage(sv_[1]).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenFds(), open_before);
  close(pipefd[0]);
  close(pipefd[1]);
}

}  // namespace
}  // namespace kvarena
