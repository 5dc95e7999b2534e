#include "daemon/unix_listener.h"

#include <fcntl.h>
#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "arena/fd_passing.h"
#include "base/status_macros.h"
#include "daemon/listen.h"

namespace kvarena {
namespace {

constexpr int kAcceptBackoffMs = 100;

void Log(const std::string& path, absl::string_view what) {
  std::cerr << "kvarenad: " << path << ": " << what << std::endl;
}

}  // namespace

void PeerUids::Record(int fd, uid_t uid) {
  absl::MutexLock lock(&mu_);
  by_fd_[fd] = uid;
}

std::optional<uid_t> PeerUids::Find(absl::string_view peer) const {
  int fd = -1;
  if (!absl::ConsumePrefix(&peer, "fd:") || !absl::SimpleAtoi(peer, &fd)) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Bind(const std::string& path,
                                                                 const SocketAccess& access,
                                                                 PeerUids* uids) {
  KVARENA_ASSIGN_OR_RETURN(int fd, ListenUnix(path, access));
  std::unique_ptr<UnixListener> listener(new UnixListener(path, fd, uids));
  if (pipe2(listener->stop_pipe_, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  return listener;
}

UnixListener::~UnixListener() {
  if (stop_pipe_[1] >= 0) {
    const char b = 0;
    (void)!write(stop_pipe_[1], &b, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  close(listen_fd_);
  for (int p : stop_pipe_) {
    if (p >= 0) close(p);
  }
  unlink(path_.c_str());
}

absl::Status UnixListener::Start(grpc::Server* server) {
  try {
    acceptor_ = std::thread([this, server] { AcceptLoop(server); });
  } catch (const std::exception& e) {  // std::system_error: no thread to be had now
    return absl::ResourceExhaustedError(
        absl::StrCat(path_, ": cannot start its thread: ", e.what()));
  }
  return absl::OkStatus();
}

bool UnixListener::WaitForStop(int timeout_ms) const {
  pollfd stop = {stop_pipe_[0], POLLIN, 0};
  return poll(&stop, 1, timeout_ms) > 0;
}

void UnixListener::AcceptLoop(grpc::Server* server) {
  bool backing_off = false;  // logged once per run of failures
  for (;;) {
    pollfd fds[2] = {{stop_pipe_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) {
      if (WaitForStop(kAcceptBackoffMs)) return;
      continue;
    }
    if (fds[0].revents != 0) return;
    if (fds[1].revents == 0) continue;
    // gRPC's endpoints expect a non-blocking socket.
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn >= 0) {
      backing_off = false;
      absl::StatusOr<PeerCred> cred = PeerCredentials(conn);
      if (!cred.ok()) {
        Log(path_,
            absl::StrCat("closing a connection: cannot learn its uid: ", cred.status().message()));
        close(conn);
        continue;
      }
      uids_->Record(conn, cred->uid);
      grpc::AddInsecureChannelFromFd(server, conn);  // gRPC owns conn from here
      continue;
    }
    const int err = errno;
    // A connection that went away, or an interrupted call: the next one may be fine.
    if (err == EINTR || err == ECONNABORTED || err == EPROTO || err == EAGAIN) continue;
    // Out of fds or memory: the connection stays queued, so retrying at once would spin.
    if (!backing_off) {
      Log(path_, absl::StrCat("accept: ", std::strerror(err), "; retrying every ", kAcceptBackoffMs,
                              " ms"));
      backing_off = true;
    }
    if (WaitForStop(kAcceptBackoffMs)) return;
  }
}

}  // namespace kvarena
