// UnixListener: a unix: gRPC listener that kvarenad accepts on itself instead of leaving it
// to gRPC, so it learns each connection's peer uid (SO_PEERCRED) — gRPC 1.51 shows a
// handler nothing of a Unix peer but "unix:". Each accepted connection is handed to the
// gRPC server with grpc::AddInsecureChannelFromFd; gRPC names the peer of its calls
// "fd:N", and PeerUids maps that back to the uid recorded at accept. The socket file is
// bound under OwnerOnlyUmask and then given its SocketAccess, like every Unix socket of
// kvarenad.
//
// When accept fails for want of fds or memory the listener waits 100 ms before trying
// again (it never stops accepting until stopped); a connection whose uid cannot be read is
// closed.
//
// Thread-safety: PeerUids is safe for concurrent use. A UnixListener is started and
// destroyed from one thread; it accepts on its own.
#ifndef KVARENA_DAEMON_UNIX_LISTENER_H_
#define KVARENA_DAEMON_UNIX_LISTENER_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "daemon/socket_access.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace kvarena {

// The uid of each connection a UnixListener handed to gRPC, by its fd.
class PeerUids {
 public:
  void Record(int fd, uid_t uid) ABSL_LOCKS_EXCLUDED(mu_);
  // The uid behind a call whose ServerContext::peer() is `peer` ("fd:N"); nullopt for any
  // other peer (TCP, or a connection no UnixListener accepted).
  std::optional<uid_t> Find(absl::string_view peer) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  // An fd's entry is replaced when the number is reused: only live connections ask.
  absl::flat_hash_map<int, uid_t> by_fd_ ABSL_GUARDED_BY(mu_);
};

class UnixListener {
 public:
  // Binds path (the caller removed a stale file: PrepareUnixSocket), applies access and
  // listens; accepts nothing until Start. uids must outlive the listener.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Bind(const std::string& path,
                                                            const SocketAccess& access,
                                                            PeerUids* uids);
  // Stops accepting, closes the socket and removes its file. Connections already handed
  // to gRPC stay gRPC's.
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Starts accepting, handing each connection to `server` (started, and alive until the
  // listener is destroyed). RESOURCE_EXHAUSTED when no thread can be started.
  absl::Status Start(grpc::Server* server);

 private:
  UnixListener(std::string path, int listen_fd, PeerUids* uids)
      : path_(std::move(path)), listen_fd_(listen_fd), uids_(uids) {}
  void AcceptLoop(grpc::Server* server);
  bool WaitForStop(int timeout_ms) const;  // true when the destructor asked to stop

  const std::string path_;
  const int listen_fd_;
  PeerUids* const uids_;
  int stop_pipe_[2] = {-1, -1};
  std::thread acceptor_;
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_UNIX_LISTENER_H_
