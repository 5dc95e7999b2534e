// AttachHub: every live Attach stream of the daemon, served on gRPC's callback API so a
// held stream costs no thread and no CPU while nothing changes. Each stream opens a
// session, or resumes the one its request's resume_token names (ending the stream still
// attached to it, if any, with ABORTED); its first event names the session, its resume
// token, its regions and the fd socket, and a further event (the whole updated region
// list) follows whenever a pool is created or destroyed (RegionsChanged). When the stream
// ends — the client cancels or goes away, a write fails, or the daemon shuts down — its
// session is detached with the grace, exactly once, unless a newer stream resumed it.
// Streams ended by the shutdown carry kAttachEndMetadataKey: there is nothing to resume.
//
// Bounds: the store's max_sessions and max_sessions_per_peer (its RESOURCE_EXHAUSTED passes
// through; a session's peer is its TCP address, or the uid of a Unix-socket peer that
// options.peer_uids knows), and at most max_per_peer live streams from one TCP peer
// address (Unix-socket peers are not counted here).
//
// Metrics: each call is counted once in RpcMetrics, by the code it ends with (CANCELLED
// when the worker went away, UNAVAILABLE at shutdown) or is refused with; it is not timed.
//
// Lifetime: gRPC owns each stream's reactor from Start() until its OnDone, which removes it
// from the hub and deletes it. BeginShutdown() finishes every stream, and the server's
// Shutdown waits for their OnDone, so the hub may be destroyed once the server has shut
// down.
//
// Thread-safety: every method may be called from any thread concurrently.
#ifndef KVARENA_DAEMON_ATTACH_H_
#define KVARENA_DAEMON_ATTACH_H_

#include <grpcpp/support/server_callback.h>

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/kv_store.h"
#include "daemon/rpc_metrics.h"
#include "daemon/tenant_scope.h"
#include "daemon/unix_listener.h"
#include "kvarena/v1/kvarena.pb.h"

namespace grpc {
class CallbackServerContext;
}  // namespace grpc

namespace kvarena {

// The address part of a gRPC peer string: "127.0.0.1" for "ipv4:127.0.0.1:5555", "::1" for
// "ipv6:[::1]:5555"; "" for a Unix-socket (or any other) peer.
std::string PeerHost(absl::string_view peer);
// Who a caller is, for the per-peer caps (--max_sessions_per_peer, --max_watchers_per_peer):
// "peer HOST" for a TCP peer, "uid N" for a Unix-socket peer whose uid `uids` knows (so
// every connection of that uid counts together), "" when unknown (capped only by the
// daemon-wide bounds). uids may be null.
std::string PeerKey(absl::string_view peer, const PeerUids* uids);

class AttachStream;

class AttachHub {
 public:
  struct Options {
    absl::Duration session_grace;         // how long a detached session's caches live on
    std::string fd_socket;                // named in every event; "" when none is served
    int max_per_peer = 64;                // live streams from one TCP peer address
    uint64_t incarnation = 0;             // AttachEvent.daemon_incarnation on every event
    const PeerUids* peer_uids = nullptr;  // Unix-socket peers' uids; null: none known
  };
  // store and rpcs must outlive the hub.
  AttachHub(KvStore* store, RpcMetrics* rpcs, Options options);
  // REQUIRES: no live stream (the server has shut down).
  ~AttachHub();
  AttachHub(const AttachHub&) = delete;
  AttachHub& operator=(const AttachHub&) = delete;

  // Serves one Attach call: a reactor that streams the session's events, or one that
  // refuses at once (UNAVAILABLE while shutting down, RESOURCE_EXHAUSTED beyond a bound,
  // caller's error when it did not authenticate, PERMISSION_DENIED for the operator
  // role). The session belongs to the caller's tenant: only it may resume or use it.
  grpc::ServerWriteReactor<v1::AttachEvent>* Start(grpc::CallbackServerContext* ctx,
                                                   const v1::AttachRequest& request,
                                                   const absl::StatusOr<Caller>& caller);

  // The set of pools changed: every live stream sends the updated region list (once more
  // after a write in flight). Called by the store with no store lock held.
  void RegionsChanged() ABSL_LOCKS_EXCLUDED(mu_);

  // Ends every live stream promptly with UNAVAILABLE and refuses new ones; call before
  // grpc::Server::Shutdown so the drain does not wait for attached workers. Idempotent.
  void BeginShutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class AttachStream;
  // A stream's OnDone: forgets it and detaches its session.
  void Done(AttachStream* stream) ABSL_LOCKS_EXCLUDED(mu_);

  KvStore* const store_;
  RpcMetrics* const rpcs_;
  const Options options_;

  // Held while calling into reactors, which never run a reaction inline (gRPC dispatches
  // OnWriteDone and OnDone to its own threads), so a reactor outlives every such call.
  absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<AttachStream*> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> per_peer_ ABSL_GUARDED_BY(mu_);  // TCP peers only
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_ATTACH_H_
