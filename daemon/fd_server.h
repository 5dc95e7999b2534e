// FdServer: the daemon's second Unix socket, which hands region file descriptors to
// attached sessions (gRPC cannot carry fds). Requests and replies are FdRequest / FdReply
// (proto/kvarena/v1/kvarena.proto) framed by arena/fd_passing; a reply's fds ride with it.
// What a request gets is decided by HandleFdRequest (daemon/fd_requests.h); this class
// accepts, frames, sends and closes.
//
// Access: the socket file gets options.access (mode and group) right after bind, which
// happens under OwnerOnlyUmask; a peer must pass CheckFdPeer (SO_PEERCRED: the daemon's
// user or root, or the daemon's user and options.allowed_uids) and name a live session.
// The peer's uid is checked as the connection is accepted, before anything is read: a
// refused peer is sent one PERMISSION_DENIED reply naming its uid (without waiting: it
// fits the empty socket buffer) and closed at once, holding no thread. A session gets the
// pools and its own scratch region, never another's.
//
// Bounds: at most max_connections connections are served at once; one beyond is closed
// as soon as it is accepted. A connection with no request for idle_timeout is closed (the
// client reconnects), and so is one whose request has not arrived whole and been answered
// within min(request_timeout, idle_timeout) of its first byte, however the peer paces its
// bytes. When accept fails for want of fds or memory the server
// waits accept_backoff before trying again; it never stops accepting until destroyed.
// No exception leaves its threads: a connection whose thread cannot be started is closed.
//
// Metrics (options.metrics): each request by operation and reply code, the fds and bytes
// of every reply sent, the connections open and those refused over the bound.
//
// Thread-safety: Start/destroy from one thread; connections are served on their own
// threads. Destruction stops accepting, wakes every connection and joins them.
#ifndef KVARENA_DAEMON_FD_SERVER_H_
#define KVARENA_DAEMON_FD_SERVER_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/kv_store.h"
#include "daemon/fd_metrics.h"
#include "daemon/socket_access.h"

namespace kvarena {

struct FdServerOptions {
  int max_connections = 256;                        // --max_fd_connections; at least 1
  absl::Duration idle_timeout = absl::Seconds(60);  // --fd_idle_timeout; positive
  // From a request's first byte to its reply's last; positive. A test hook: no flag sets it.
  absl::Duration request_timeout = absl::Seconds(5);
  absl::Duration accept_backoff = absl::Milliseconds(100);  // positive
  SocketAccess access;                                      // --socket_mode, --socket_group
  std::vector<uid_t> allowed_uids;                          // --allowed_uids (CheckFdPeer)
  // The accept4(2) call: a connected fd, or -1 with errno set. A seam for tests that
  // inject its failures; null: accept4 with SOCK_CLOEXEC.
  std::function<int(int listen_fd)> accept;
  // Where requests, exports and connections are counted; null: nowhere. Must outlive
  // the server.
  FdMetrics* metrics = nullptr;
};

class FdServer {
 public:
  // Binds path (replacing a stale socket file) and applies options.access. INVALID_ARGUMENT
  // for options out of range, naming the flag.
  static absl::StatusOr<std::unique_ptr<FdServer>> Start(const std::string& path, KvStore* store,
                                                         FdServerOptions options = {});
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  const std::string& path() const { return path_; }

 private:
  FdServer(std::string path, int listen_fd, KvStore* store, FdServerOptions options);
  void AcceptLoop();
  // When CheckFdPeer refuses conn's peer: sends it the refusal, closes conn and returns
  // true. Reads nothing from conn.
  bool RefusedPeer(int conn);
  // Serves conn on a new thread, or closes it (over the bound, or no thread to be had).
  void Admit(int conn);
  // A connection's thread: serves conn until it closes, idles out or fails, then closes it.
  void RunConnection(int conn);
  void Serve(int conn);
  // OK when the peer on conn may fetch fds (CheckFdPeer); else why not.
  absl::Status PeerAccess(int conn) const;
  // Waits until conn is readable: true; false after idle_timeout or on a poll error.
  bool AwaitRequest(int conn) const;
  // Waits on the stop pipe for up to `timeout`; true once the server is stopping.
  bool WaitForStop(absl::Duration timeout) const;

  const std::string path_;
  const int listen_fd_;
  KvStore* const store_;
  const FdServerOptions options_;
  int stop_pipe_[2] = {-1, -1};
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable idle_;
  // Open connections, each served by a detached thread; capacity max_connections, so
  // adding one never allocates. Guarded by mu_.
  std::vector<int> conns_;
  bool refusing_ = false;  // the last connection was over the bound (logged once); guarded by mu_
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_FD_SERVER_H_
