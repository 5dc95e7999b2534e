// Daemon: one running kvarenad — the KvStore, the gRPC server (KvCacheService, the
// standard health service, server reflection) on every --listen address, the fd socket
// that shares pool and scratch memory with attached workers, the session reaper and the
// optional metrics endpoint. Unix sockets are bound owner-only and then given
// socket_mode and socket_group (daemon/socket_access.h), and accepted by kvarenad itself,
// which learns each peer's uid (daemon/unix_listener.h); TCP listeners get the
// credentials of daemon/tcp_credentials.h.
//
// Thread-safety: Shutdown() may be called from any thread, once; Wait() from one.
#ifndef KVARENA_DAEMON_SERVER_H_
#define KVARENA_DAEMON_SERVER_H_

#include <grpcpp/server.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/kv_store.h"
#include "daemon/attach.h"
#include "daemon/fd_metrics.h"
#include "daemon/fd_server.h"
#include "daemon/listen.h"
#include "daemon/metrics.h"
#include "daemon/rpc_metrics.h"
#include "daemon/service.h"
#include "daemon/tcp_credentials.h"
#include "daemon/tiers.h"
#include "daemon/unix_listener.h"

namespace kvarena {

struct DaemonOptions {
  // The store's knobs (core/kv_store.h: their defaults and meaning), which the daemon's
  // flags of the same names set. store.max_reply_bytes (--max_message_bytes) also bounds
  // every gRPC message both ways; store.kernels, on_* and tiers are the daemon's to fill.
  StoreOptions store;

  std::vector<std::string> listen = {"unix:/tmp/kvarena.sock"};
  std::string backend = "auto";  // auto | host | cuda (daemon/backend.h)
  absl::Duration session_grace = absl::Seconds(5);
  int metrics_port = 0;  // 0: no metrics endpoint
  std::string metrics_address = "127.0.0.1";
  // The fd socket (FdServer) that hands region fds to attached sessions: "" = beside the
  // first unix: listen address (its path + ".fds"), none without one; "none" = off.
  std::string fd_socket;

  // Access (docs/trust.md). Every Unix socket, gRPC and fd socket alike, gets this
  // mode (CheckSocketMode) and group (a name or gid; "": the group it was created with).
  mode_t socket_mode = 0660;
  std::string socket_group;
  std::vector<uid_t> allowed_uids;  // fd socket: CheckFdPeer; empty: own uid or root
  TcpSecurityOptions tcp;           // TLS, mutual TLS, bearer token: TCP listeners only
  // Tenants (daemon/tenants.h): every KvCacheService call on every listener names one by
  // its bearer token; "" = none. Excludes tcp.auth_token_file. Each tenant's line adds
  // its bounds to store.owners.
  std::string tenants_file;

  // The daemon's own bounds (the store's are in `store`): each refused request gets a
  // specific code and a message naming the flag.
  int max_attach_per_peer = 64;         // Attach streams from one TCP peer address
  int max_watchers_per_peer = 8;        // WatchEvents streams from one TCP peer address or Unix uid
  uint64_t watcher_max_backlog = 4096;  // events recorded during one write before a watcher
                                        // is dropped
  int max_fd_connections = 256;         // open fd-socket connections
  uint64_t max_queued_bytes = kDefaultMaxQueuedBytes;    // requests the Offload pool holds
  absl::Duration fd_idle_timeout = absl::Seconds(60);    // an idle fd-socket connection closes
  absl::Duration fd_request_timeout = absl::Seconds(5);  // one fd-socket request, first byte
                                                         // to reply
  TierFlags tiers;  // the tiers below the arena (daemon/tiers.h); none by default
};

class Daemon {
 public:
  // Creates the store, binds every address and starts serving (health SERVING).
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Health NOT_SERVING, Attach streams end, then in-flight calls get up to `deadline` to
  // finish while new calls are refused (UNAVAILABLE); then the fd socket closes.
  void Shutdown(absl::Duration deadline);
  // Blocks until the server has shut down.
  void Wait();

  // "kvarenad: serving backend=host arena_bytes=1Gi ... metrics=127.0.0.1:9464 on
  // unix:/tmp/kvarena.sock,0.0.0.0:7070 tcp=tls+token fd_socket=/tmp/kvarena.sock.fds"
  std::string StartLine() const;
  // The fd socket's path; "" when none is served.
  std::string fd_socket() const;

 private:
  explicit Daemon(const DaemonOptions& options) : options_(options) {}

  const DaemonOptions options_;
  std::vector<ListenAddress> addresses_;
  // " tcp=tls+token tenants=N" for the start line; "" without TCP listeners or tenants
  std::string tcp_security_;
  // Counted into by the service, the AttachHub and the fd socket, read by metrics_: they
  // outlive all four.
  RpcMetrics rpcs_;
  FdMetrics fd_metrics_;
  TierLatency tier_latency_;           // the tiers' store calls, for metrics_
  const RedisStore* redis_ = nullptr;  // the cluster tier (owned by the store's tiers), if any
  // Before store_, so it outlives it: a pool the store destroys last still records an event.
  std::unique_ptr<EventsHub> events_;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<FdServer> fd_server_;  // before store_ in destruction: it reads the store
  // The store tells it when pools change; it outlives server_, whose Shutdown waits for
  // every stream it serves to finish.
  std::unique_ptr<AttachHub> attach_;
  PeerUids peer_uids_;                // filled by unix_listeners_, read by attach_
  std::unique_ptr<Tenants> tenants_;  // null without --tenants_file
  std::unique_ptr<KvCacheServiceImpl> service_;
  std::unique_ptr<MetricsServer> metrics_;
  std::unique_ptr<grpc::Server> server_;
  // The unix: listeners, which hand connections to server_: stopped before it shuts down.
  std::vector<std::unique_ptr<UnixListener>> unix_listeners_;
  absl::Notification stop_reaper_;
  std::thread reaper_;
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_SERVER_H_
