// EventsHub: every live WatchEvents stream of the daemon, on gRPC's callback API (a held
// stream costs no thread). A stream replays the store's prefix-index events from the
// caller's from_seq (core/prefix_events.h: a bounded buffer; events_lost when the caller
// asks for more than it keeps, or for a from_seq past the newest event: then it replays
// from the oldest kept), then sends each new batch as the store records it. Its first
// message comes at once, with the events it replays (maybe none) and next_seq. Every
// message carries the daemon's incarnation.
//
// Registrations never wait on a watcher: the store's listener (EventsRecorded, run under a
// pool's lock) only raises a flag and wakes the hub's one dispatcher thread, which starts
// a write on each idle stream; a stream with a write in flight pulls what was recorded
// meanwhile when that write completes.
//
// Bounds: at most max_watchers live streams, and max_watchers_per_peer from one peer
// (PeerKey: a TCP address, or a Unix-socket uid across all its connections; a peer of
// unknown uid counts against max_watchers only), RESOURCE_EXHAUSTED beyond, naming the
// bound. At most one write in flight per stream, each of at most 256 events.
// A watcher that does not read — more than max_backlog events were recorded while one of
// its writes waited for it — is dropped: it gets nothing more, and once that write
// completes it ends with RESOURCE_EXHAUSTED whose message and trailing metadata
// (kResumeFromSeqMetadataKey) name the from_seq to watch again from. A client that never reads
// keeps its stream (and its slot) until it goes away.
//
// Lifetime: gRPC owns each reactor from Start() until its OnDone. BeginShutdown() ends
// every stream and refuses new ones; the server's Shutdown waits for their OnDone. The
// destructor stops the dispatcher.
//
// Thread-safety: every method may be called from any thread. EventsRecorded takes only a
// small lock of its own (never the hub's or a stream's) and never calls into the store.
#ifndef KVARENA_DAEMON_EVENTS_H_
#define KVARENA_DAEMON_EVENTS_H_

#include <grpcpp/support/server_callback.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "core/kv_store.h"
#include "daemon/rpc_metrics.h"
#include "daemon/tenant_scope.h"
#include "daemon/unix_listener.h"
#include "kvarena/v1/kvarena.pb.h"

namespace grpc {
class CallbackServerContext;
}  // namespace grpc

namespace kvarena {

class EventsStream;

class EventsHub {
 public:
  struct Options {
    int max_watchers = 64;
    uint64_t incarnation = 0;             // WatchEventsResponse.daemon_incarnation on every message
    int max_watchers_per_peer = 8;        // live streams of one PeerKey: a TCP address, a Unix uid
    uint64_t max_backlog = 4096;          // events recorded during one write before it is dropped
    const PeerUids* peer_uids = nullptr;  // Unix-socket peers' uids; null: none known
  };
  // store and rpcs must outlive the hub's streams.
  EventsHub(const KvStore* store, RpcMetrics* rpcs, Options options);
  // REQUIRES: no live stream (the server has shut down).
  ~EventsHub();
  EventsHub(const EventsHub&) = delete;
  EventsHub& operator=(const EventsHub&) = delete;

  // With tenants, the stream carries only the caller's namespaces' events, the
  // namespaces stripped (the operator: all); without, events carry namespaces and token
  // ids only for SeesAllNames callers. Refused at once with the caller's error when it
  // did not authenticate.
  grpc::ServerWriteReactor<v1::WatchEventsResponse>* Start(grpc::CallbackServerContext* ctx,
                                                           const v1::WatchEventsRequest& request,
                                                           const absl::StatusOr<Caller>& caller)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The store recorded events: wakes the dispatcher, which has every idle stream send
  // what it has not sent yet. O(1).
  void EventsRecorded() ABSL_LOCKS_EXCLUDED(wake_mu_);
  void BeginShutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class EventsStream;
  void Done(EventsStream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  // The dispatcher thread: pokes every stream once per wake-up (wake-ups coalesce).
  void Dispatch() ABSL_LOCKS_EXCLUDED(mu_, wake_mu_);
  bool WakeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) { return pending_ || stopping_; }

  const KvStore* const store_;
  RpcMetrics* const rpcs_;
  const Options options_;
  const std::string medium_;  // BlockStored.medium: the store's Medium()
  absl::Mutex mu_;
  absl::flat_hash_set<EventsStream*> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> per_peer_ ABSL_GUARDED_BY(mu_);  // by PeerKey
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;

  std::atomic<int> live_{0};             // streams_.size(): with none, EventsRecorded wakes nobody
  std::atomic<bool> wake_asked_{false};  // a wake-up is pending: later ones need no lock
  absl::Mutex wake_mu_;
  bool pending_ ABSL_GUARDED_BY(wake_mu_) = false;   // events recorded since the last walk
  bool stopping_ ABSL_GUARDED_BY(wake_mu_) = false;  // the destructor runs
  std::thread dispatcher_;                           // last: starts once everything above is built
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_EVENTS_H_
