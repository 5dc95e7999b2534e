#include "arena/fd_passing.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"

namespace kvarena {
namespace {

absl::Status Errno(const char* what) {
  const int err = errno;
  if (err == EPIPE || err == ECONNRESET) {
    return absl::UnavailableError(absl::StrCat(what, ": peer closed the socket"));
  }
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
}

// After a call that would block under a finite deadline: waits until sock has `events`
// (POLLIN or POLLOUT), OK, or DEADLINE_EXCEEDED once the deadline passes.
absl::Status AwaitReady(int sock, short events, absl::Time deadline, const char* what) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": the message's deadline passed"));
    }
    const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
    pollfd p = {sock, events, 0};
    const int n = poll(&p, 1, int(std::min<int64_t>(ms, INT_MAX)));
    if (n > 0) return absl::OkStatus();  // ready, or an error the call itself reports
    if (n < 0 && errno != EINTR) return Errno("poll");
  }
}

// Reads exactly n bytes; collects any fds that ride along, at most kMaxFdsPerMessage in
// all (INVALID_ARGUMENT beyond, the extras closed): a peer cannot make a receiver hold
// more fds than one message may carry by sending its bytes in many fd-laden pieces.
absl::Status ReadFull(int sock, char* buf, size_t n, std::vector<int>* fds, absl::Time deadline) {
  // Under a deadline no call blocks: one that would waits in AwaitReady, up to the deadline.
  const bool timed = deadline != absl::InfiniteFuture();
  const int flags = MSG_CMSG_CLOEXEC | (timed ? MSG_DONTWAIT : 0);
  size_t got = 0;
  while (got < n) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
    iovec iov{buf + got, n - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t r = recvmsg(sock, &msg, flags);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && timed && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      KVARENA_RETURN_IF_ERROR(AwaitReady(sock, POLLIN, deadline, "recvmsg"));
      continue;
    }
    if (r < 0) return Errno("recvmsg");
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const int* p = reinterpret_cast<const int*>(CMSG_DATA(c));
      fds->insert(fds->end(), p, p + count);
    }
    if (fds->size() > kMaxFdsPerMessage) {
      return absl::InvalidArgumentError(absl::StrCat(
          "recvmsg: ", fds->size(), " fds came with one message; at most ", kMaxFdsPerMessage));
    }
    if (r == 0) return absl::UnavailableError("recvmsg: peer closed the socket");
    if (msg.msg_flags & MSG_CTRUNC) return absl::InternalError("recvmsg: fds truncated");
    got += size_t(r);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SendMessage(int sock, absl::string_view bytes, absl::Span<const int> fds,
                         absl::Time deadline) {
  if (bytes.size() > kMaxMessageBytes || fds.size() > kMaxFdsPerMessage) {
    return absl::InvalidArgumentError(
        absl::StrCat("send: ", bytes.size(), " bytes and ", fds.size(), " fds exceed one message"));
  }
  const uint32_t len = uint32_t(bytes.size());
  std::string frame(reinterpret_cast<const char*>(&len), sizeof(len));
  frame.append(bytes.data(), bytes.size());
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  const bool timed = deadline != absl::InfiniteFuture();  // as in ReadFull
  const int flags = MSG_NOSIGNAL | (timed ? MSG_DONTWAIT : 0);
  size_t sent = 0;
  while (sent < frame.size()) {
    iovec iov{frame.data() + sent, frame.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (sent == 0 && !fds.empty()) {  // the fds ride on the first byte
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t r = sendmsg(sock, &msg, flags);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && timed && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      KVARENA_RETURN_IF_ERROR(AwaitReady(sock, POLLOUT, deadline, "sendmsg"));
      continue;
    }
    if (r < 0) return Errno("sendmsg");
    sent += size_t(r);
  }
  return absl::OkStatus();
}

absl::StatusOr<Message> RecvMessage(int sock, absl::Time deadline) {
  Message m;
  uint32_t len = 0;
  absl::Status s = ReadFull(sock, reinterpret_cast<char*>(&len), sizeof(len), &m.fds, deadline);
  if (s.ok() && len > kMaxMessageBytes) {
    s = absl::InvalidArgumentError(absl::StrCat("recv: message of ", len, " bytes is too large"));
  }
  if (s.ok()) {
    m.bytes.resize(len);
    s = ReadFull(sock, m.bytes.data(), len, &m.fds, deadline);
  }
  if (!s.ok()) {
    for (int fd : m.fds) close(fd);
    return s;
  }
  return m;
}

absl::StatusOr<PeerCred> PeerCredentials(int sock) {
  ucred c{};
  socklen_t len = sizeof(c);
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) return Errno("SO_PEERCRED");
  return PeerCred{c.pid, c.uid, c.gid};
}

absl::StatusOr<int> ConnectUnix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path has ", path.size(),
                                                   " bytes; at most ", sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    absl::Status s =
        absl::UnavailableError(absl::StrCat("connect ", path, ": ", std::strerror(errno)));
    close(fd);
    return s;
  }
  return fd;
}

}  // namespace kvarena
