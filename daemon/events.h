// EventsHub: every live WatchEvents stream of the daemon, on gRPC's callback API (a held
// stream costs no thread). A stream replays the store's prefix-index events from the
// caller's from_seq (core/prefix_events.h: a bounded buffer; events_lost when the caller
// asks for more than it keeps), then sends each new batch as the store records it. Its
// first message comes at once, with the events it replays (maybe none) and next_seq.
//
// Bounds: at most max_watchers live streams (RESOURCE_EXHAUSTED beyond); at most one write
// in flight per stream, each of at most 256 events, so a slow watcher holds no more than
// the store's buffer (it falls behind and learns it lost events).
//
// Lifetime: gRPC owns each reactor from Start() until its OnDone. BeginShutdown() ends
// every stream and refuses new ones; the server's Shutdown waits for their OnDone.
//
// Thread-safety: every method may be called from any thread. EventsRecorded runs under a
// pool's lock (the store's listener): it takes the hub's and the streams' locks, reads the
// event log and starts writes, and never calls back into the store's pools.
#ifndef KVARENA_DAEMON_EVENTS_H_
#define KVARENA_DAEMON_EVENTS_H_

#include <grpcpp/support/server_callback.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "core/kv_store.h"
#include "daemon/rpc_metrics.h"
#include "daemon/tenant_scope.h"
#include "kvarena/v1/kvarena.pb.h"

namespace kvarena {

class EventsStream;

class EventsHub {
 public:
  struct Options {
    int max_watchers = 64;
  };
  // store and rpcs must outlive the hub's streams.
  EventsHub(const KvStore* store, RpcMetrics* rpcs, Options options);
  ~EventsHub();
  EventsHub(const EventsHub&) = delete;
  EventsHub& operator=(const EventsHub&) = delete;

  // With tenants, the stream carries only the caller's namespaces' events, the
  // namespaces stripped (the operator: all); without, events carry namespaces and token
  // ids only for SeesAllNames callers. Refused at once with the caller's error when it
  // did not authenticate.
  grpc::ServerWriteReactor<v1::WatchEventsResponse>* Start(const v1::WatchEventsRequest& request,
                                                           const absl::StatusOr<Caller>& caller)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The store recorded events: every idle stream sends what it has not sent yet.
  void EventsRecorded() ABSL_LOCKS_EXCLUDED(mu_);
  void BeginShutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class EventsStream;
  void Done(EventsStream* stream) ABSL_LOCKS_EXCLUDED(mu_);

  const KvStore* const store_;
  RpcMetrics* const rpcs_;
  const Options options_;
  const std::string medium_;  // BlockStored.medium: the store's Medium()
  absl::Mutex mu_;
  absl::flat_hash_set<EventsStream*> streams_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_EVENTS_H_
