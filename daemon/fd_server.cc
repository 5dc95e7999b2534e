#include "daemon/fd_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <exception>
#include <iostream>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "arena/fd_passing.h"
#include "base/status_macros.h"
#include "core/refusal.h"
#include "daemon/fd_requests.h"
#include "daemon/listen.h"
#include "kvarena/v1/kvarena.pb.h"

namespace kvarena {
namespace {

// A poll(2) timeout: -1 for an infinite duration, else at least 1 ms.
int PollMillis(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return -1;
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(d, absl::Milliseconds(1)));
  return int(std::clamp<int64_t>(ms, 1, INT_MAX));
}

void Log(absl::string_view what) { std::cerr << "kvarenad: fd socket: " << what << std::endl; }

absl::Status CheckOptions(const FdServerOptions& o) {
  if (o.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_fd_connections=", o.max_connections, " must be at least 1"));
  }
  if (o.idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fd_idle_timeout=", absl::FormatDuration(o.idle_timeout), " must be positive"));
  }
  if (o.request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd socket: request_timeout=", absl::FormatDuration(o.request_timeout),
                     " must be positive"));
  }
  if (o.accept_backoff <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd socket: accept_backoff=", absl::FormatDuration(o.accept_backoff), " must be positive"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<FdServer>> FdServer::Start(const std::string& path, KvStore* store,
                                                          FdServerOptions options) {
  KVARENA_RETURN_IF_ERROR(CheckOptions(options));
  if (!options.accept) {
    options.accept = [](int listen_fd) {
      return accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    };
  }
  // A socket file nobody answers on is stale (a daemon that died); a live one is not ours.
  if (absl::StatusOr<int> live = ConnectUnix(path); live.ok()) {
    close(*live);
    return absl::FailedPreconditionError(
        absl::StrCat("fd socket ", path, " is in use by a live daemon"));
  }
  unlink(path.c_str());
  absl::StatusOr<int> listening = ListenUnix(path, options.access);
  if (!listening.ok()) return Annotated(listening.status(), "fd socket: ");
  const int fd = *listening;
  std::unique_ptr<FdServer> server(new FdServer(path, fd, store, std::move(options)));
  if (pipe2(server->stop_pipe_, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  try {
    server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  } catch (const std::exception& e) {  // std::system_error: no thread to be had now
    return absl::ResourceExhaustedError(
        absl::StrCat("fd socket: cannot start its thread: ", e.what()));
  }
  return server;
}

FdServer::FdServer(std::string path, int listen_fd, KvStore* store, FdServerOptions options)
    : path_(std::move(path)), listen_fd_(listen_fd), store_(store), options_(std::move(options)) {
  conns_.reserve(size_t(options_.max_connections));
}

FdServer::~FdServer() {
  if (stop_pipe_[1] >= 0) {
    const char b = 0;
    (void)!write(stop_pipe_[1], &b, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (int c : conns_) shutdown(c, SHUT_RDWR);  // wakes a worker blocked in poll, recv or send
    idle_.wait(lock, [this] { return conns_.empty(); });
  }
  close(listen_fd_);
  for (int p : stop_pipe_) {
    if (p >= 0) close(p);
  }
  unlink(path_.c_str());
}

bool FdServer::WaitForStop(absl::Duration timeout) const {
  pollfd stop = {stop_pipe_[0], POLLIN, 0};
  return poll(&stop, 1, PollMillis(timeout)) > 0;
}

// Throws nothing: Admit catches what starting a thread throws.
void FdServer::AcceptLoop() {
  bool backing_off = false;  // logged once per run of failures
  for (;;) {
    pollfd fds[2] = {{stop_pipe_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) {
      if (WaitForStop(options_.accept_backoff)) return;
      continue;
    }
    if (fds[0].revents != 0) return;
    if (fds[1].revents == 0) continue;
    const int conn = options_.accept(listen_fd_);
    if (conn >= 0) {
      backing_off = false;
      if (!RefusedPeer(conn)) Admit(conn);
      continue;
    }
    const int err = errno;
    // A connection that went away, or an interrupted call: the next one may be fine.
    if (err == EINTR || err == ECONNABORTED || err == EPROTO || err == EAGAIN) continue;
    // Out of fds or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) or worse: the connection
    // stays queued, so retrying at once would spin. Wait, then try again.
    if (!backing_off) {
      Log(absl::StrCat("accept: ", std::strerror(err), "; retrying every ",
                       absl::FormatDuration(options_.accept_backoff)));
      backing_off = true;
    }
    if (WaitForStop(options_.accept_backoff)) return;
  }
}

void FdServer::Admit(int conn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (conns_.size() >= size_t(options_.max_connections)) {
    close(conn);  // the peer reads EOF at once; everyone already connected is still served
    if (options_.metrics != nullptr) options_.metrics->ConnectionRefused();
    if (!refusing_) {
      Log(absl::StrCat("closing new connections: ", conns_.size(),
                       " are open (--max_fd_connections=", options_.max_connections, ")"));
      refusing_ = true;
    }
    return;
  }
  refusing_ = false;
  conns_.push_back(conn);  // within the reserved capacity: cannot throw
  if (options_.metrics != nullptr) options_.metrics->ConnectionOpened();
  try {
    std::thread([this, conn] { RunConnection(conn); }).detach();
  } catch (const std::exception& e) {  // std::system_error: no thread to be had now
    if (options_.metrics != nullptr) options_.metrics->ConnectionClosed();
    conns_.pop_back();
    close(conn);
    Log(absl::StrCat("closing a connection: cannot start its thread: ", e.what()));
  }
}

void FdServer::RunConnection(int conn) {
  try {
    Serve(conn);
  } catch (const std::exception& e) {
    Log(absl::StrCat("closing a connection: ", e.what()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  close(conn);
  std::erase(conns_, conn);
  if (options_.metrics != nullptr) options_.metrics->ConnectionClosed();
  if (conns_.empty()) idle_.notify_all();
}

bool FdServer::AwaitRequest(int conn) const {
  const absl::Time deadline = absl::Now() + options_.idle_timeout;
  for (;;) {
    pollfd p = {conn, POLLIN, 0};
    const int n = poll(&p, 1, PollMillis(deadline - absl::Now()));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

absl::Status FdServer::PeerAccess(int conn) const {
  absl::StatusOr<PeerCred> c = PeerCredentials(conn);
  if (!c.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("fd socket: cannot learn the peer's uid: ", c.status().message()));
  }
  return CheckFdPeer(c->uid, geteuid(), options_.allowed_uids);
}

bool FdServer::RefusedPeer(int conn) {
  const absl::Status access = PeerAccess(conn);
  if (access.ok()) return false;
  std::vector<SharedPiece> none;
  FdOp op = FdOp::kNone;
  const v1::FdReply reply = HandleFdRequest(*store_, "", access, &none, &op);
  if (options_.metrics != nullptr)
    options_.metrics->CountRequest(op, absl::StatusCode(reply.code()));
  // A past deadline: sent only if it fits the socket's empty buffer at once, as it does.
  (void)SendMessage(conn, reply.SerializeAsString(), {}, absl::InfinitePast());
  close(conn);
  return true;
}

void FdServer::Serve(int conn) {
  const absl::Duration request_timeout = std::min(options_.request_timeout, options_.idle_timeout);
  while (AwaitRequest(conn)) {
    // One deadline from the request's first byte to the last byte of its reply, however
    // the peer paces its bytes.
    const absl::Time deadline = absl::Now() + request_timeout;
    // Fails when the peer closed, missed the deadline or sent a bad frame.
    absl::StatusOr<Message> in = RecvMessage(conn, deadline);
    if (!in.ok()) return;
    for (int fd : in->fds) close(fd);  // clients send none
    std::vector<SharedPiece> pieces;
    absl::Cleanup close_pieces = [&pieces] {
      for (const SharedPiece& p : pieces) close(p.fd);
    };
    FdOp op = FdOp::kNone;
    const v1::FdReply reply = HandleFdRequest(*store_, in->bytes, absl::OkStatus(), &pieces, &op);
    std::vector<int> fds;
    uint64_t bytes = 0;
    for (const SharedPiece& p : pieces) {
      fds.push_back(p.fd);
      bytes += p.bytes;
    }
    FdMetrics* const metrics = options_.metrics;
    if (metrics != nullptr) metrics->CountRequest(op, absl::StatusCode(reply.code()));
    if (!SendMessage(conn, reply.SerializeAsString(), fds, deadline).ok()) return;
    if (metrics != nullptr) metrics->CountExport(fds.size(), bytes);
  }
}

}  // namespace kvarena
