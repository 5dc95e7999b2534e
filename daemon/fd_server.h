// FdServer: the daemon's second Unix socket, which hands region file descriptors to
// attached sessions (gRPC cannot carry fds). Requests and replies are FdRequest / FdReply
// (proto/kvarena/v1/kvarena.proto) framed by arena/fd_passing; a reply's fds ride with it.
//
// Access: the peer must run as the daemon's user or as root (SO_PEERCRED) and name a live
// session; a session gets the pools and its own scratch region, never another's.
//
// Thread-safety: Start/destroy from one thread; connections are served on their own
// threads. Destruction stops accepting, wakes every connection and joins them.
#ifndef KVARENA_DAEMON_FD_SERVER_H_
#define KVARENA_DAEMON_FD_SERVER_H_

#include <memory>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "core/kv_store.h"

namespace kvarena {

class FdServer {
 public:
  // Binds path (replacing a stale socket file), mode 0660.
  static absl::StatusOr<std::unique_ptr<FdServer>> Start(const std::string& path, KvStore* store);
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  const std::string& path() const { return path_; }

 private:
  FdServer(std::string path, int listen_fd, KvStore* store);
  void AcceptLoop();
  void Serve(int conn);

  const std::string path_;
  const int listen_fd_;
  KvStore* const store_;
  int stop_pipe_[2] = {-1, -1};
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable idle_;
  std::vector<int> conns_;  // open connections, each served by a detached thread; guarded by mu_
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_FD_SERVER_H_
