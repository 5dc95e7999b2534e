// Listening addresses of kvarenad (--listen): `unix:PATH` (also `unix://ABS_PATH`) or
// `HOST:PORT`, and the care a Unix socket path needs before bind (after it, the file's mode
// and group: daemon/socket_access.h). Thread-compatible.
#ifndef KVARENA_DAEMON_LISTEN_H_
#define KVARENA_DAEMON_LISTEN_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/socket_access.h"

namespace kvarena {

struct ListenAddress {
  std::string uri;        // as gRPC takes it
  std::string unix_path;  // the socket file; empty for TCP
};

// INVALID_ARGUMENT for an empty list or entry.
absl::StatusOr<std::vector<ListenAddress>> ParseListenAddresses(
    const std::vector<std::string>& specs);

// Before bind: creates the parent directory when missing; removes a stale socket file
// (one nobody answers on: connect() gets ECONNREFUSED). ALREADY_EXISTS when a live
// process answers on it, FAILED_PRECONDITION when the path is not a socket.
absl::Status PrepareUnixSocket(const std::string& path);

// Binds a Unix stream socket (close-on-exec) at path under OwnerOnlyUmask, listens, then
// gives the file `access`. Returns the listening fd, which the caller owns. INVALID_ARGUMENT
// for a path too long; the bind or listen error (naming the path) else.
absl::StatusOr<int> ListenUnix(const std::string& path, const SocketAccess& access);

}  // namespace kvarena

#endif  // KVARENA_DAEMON_LISTEN_H_
