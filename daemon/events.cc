#include "daemon/events.h"

#include <grpcpp/server_context.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/refusal.h"
#include "daemon/attach.h"
#include "daemon/status.h"
#include "daemon/write_stream.h"
#include "proto/wire.h"

namespace kvarena {
namespace {

constexpr size_t kMaxEventsPerMessage = 256;

class RefusedWatch final : public grpc::ServerWriteReactor<v1::WatchEventsResponse> {
 public:
  explicit RefusedWatch(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

// One live WatchEvents stream on the write queue (daemon/write_stream.h): what is recorded
// during a write goes in the next one.
class EventsStream final : public WriteStream<v1::WatchEventsResponse> {
 public:
  EventsStream(EventsHub* hub, grpc::CallbackServerContext* ctx, uint64_t from_seq,
               std::string peer_key, const Caller& caller)
      : WriteStream(hub->rpcs_, Rpc::kWatchEvents, "watch_events: the client went away"),
        hub_(hub),
        ctx_(ctx),
        peer_key_(std::move(peer_key)),
        scope_(caller.tenant),
        all_names_(SeesAllNames(caller)),
        next_(from_seq) {}

  const std::string& peer_key() const { return peer_key_; }  // PeerKey

  // Sends what was recorded since the last write, unless a write is in flight: then the
  // stream pulls it when that write completes, or is dropped when it fell too far behind.
  void Poke(bool first) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (EndingLocked()) return;
    if (!WritingLocked()) return WriteLocked(first);
    DropIfBehindLocked();
  }

  void OnDone() override {
    hub_->Done(this);
    delete this;
  }

 private:
  // Ends the stream (after the write in flight) with the seq to resume from when more than
  // max_backlog events were recorded since that write started: the watcher does not read.
  // A replay of old events, read as fast as it is sent, is never behind.
  void DropIfBehindLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (EndingLocked()) return;
    const uint64_t recorded = hub_->store_->NextPrefixEventSeq() - newest_at_write_;
    if (recorded <= hub_->options_.max_backlog) return;
    resume_from_ = next_;
    EndAfterWriteLocked(RefusedError(
        Refusal::kWatcherBehind,
        absl::StrCat("watch_events: dropped this watcher: ", recorded,
                     " events were recorded while one of its "
                     "writes waited for the client to read (at most ",
                     hub_->options_.max_backlog, "); watch again with from_seq=", next_)));
  }

  void WriteDoneLocked(bool ok) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ok) DropIfBehindLocked();
  }
  // What was recorded during the write, if anything.
  void WriteNextLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    WriteLocked(/*first=*/false);
  }

  void WriteLocked(bool first) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bool lost = false;
    // Read before the events: one recorded after this read has a seq at or past it, so
    // moving next_ up to it below skips nothing.
    const uint64_t next_seq = hub_->store_->NextPrefixEventSeq();
    std::vector<PrefixEvent> events =
        hub_->store_->PrefixEvents(next_, kMaxEventsPerMessage, &lost);
    if (events.empty() && !lost && !first) return;
    response_.Clear();
    for (PrefixEvent& e : events) {
      if (!VisibleLocked(&e)) continue;
      if (!all_names_) {
        e.token_ids.clear();
        e.prefix_namespace.clear();
      }
      v1::KvEvent* p = response_.add_events();
      ToProto(e, p);
      // The arena's events carry no medium of their own: it is this daemon's device.
      if (p->has_stored() && e.medium.empty()) p->mutable_stored()->set_medium(hub_->medium_);
      if (p->has_removed() && e.medium.empty()) p->mutable_removed()->set_medium(hub_->medium_);
    }
    response_.set_events_lost(lost);
    if (!events.empty()) {
      next_ = events.back().seq + 1;
    } else {
      // Lost with nothing kept: from_seq was past the newest event (it came back to next_seq).
      next_ = lost ? next_seq : std::max(next_, next_seq);
    }
    response_.set_next_seq(next_);
    response_.set_daemon_incarnation(hub_->options_.incarnation);
    newest_at_write_ = next_seq;
    StartWriteLocked(&response_);
  }

  // Whether the caller may see e; a tenant's stored event gets its namespace stripped.
  // A removed event carries no namespace: a tenant sees it for a page this stream saw
  // stored in one of its namespaces (what it holds is bounded by the pages alive).
  bool VisibleLocked(PrefixEvent* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!scope_.tenanted()) return true;
    switch (e->kind) {
      case PrefixEvent::Kind::kStored:
        if (!scope_.Sees(e->prefix_namespace)) return false;
        e->prefix_namespace = scope_.Out(e->prefix_namespace);
        if (!scope_.sees_all()) seen_.insert({e->pool_id, e->hash});
        return true;
      case PrefixEvent::Kind::kRemoved:
        return scope_.sees_all() || seen_.erase({e->pool_id, e->hash}) > 0;
      case PrefixEvent::Kind::kAllCleared:
        if (!scope_.sees_all()) seen_.clear();
        return true;
    }
    return false;
  }

  // A watcher dropped for lagging is told where to resume.
  void AddTrailersLocked(const absl::Status&) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (resume_from_.has_value()) {
      ctx_->AddTrailingMetadata(kResumeFromSeqMetadataKey, absl::StrCat(*resume_from_));
    }
  }

  EventsHub* const hub_;
  grpc::CallbackServerContext* const ctx_;  // gRPC's, valid until OnDone
  const std::string peer_key_;
  const TenantScope scope_;
  const bool all_names_;  // else events go without namespaces and token ids
  // A tenant's stream: the pages (pool, hash) it sent stored events for, not yet removed.
  absl::flat_hash_set<std::pair<uint64_t, Hash128>> seen_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_);                 // the seq to send next (0: the oldest kept)
  uint64_t newest_at_write_ ABSL_GUARDED_BY(mu_) = 0;  // NextPrefixEventSeq() as the write began
  v1::WatchEventsResponse response_ ABSL_GUARDED_BY(mu_);     // gRPC reads it while writing
  std::optional<uint64_t> resume_from_ ABSL_GUARDED_BY(mu_);  // set when dropped for lagging
};

EventsHub::EventsHub(const KvStore* store, RpcMetrics* rpcs, Options options)
    : store_(store), rpcs_(rpcs), options_(options), medium_(store->Medium()), dispatcher_([this] {
        Dispatch();
      }) {}

EventsHub::~EventsHub() {
  {
    absl::MutexLock lock(&wake_mu_);
    stopping_ = true;
  }
  dispatcher_.join();
}

grpc::ServerWriteReactor<v1::WatchEventsResponse>* EventsHub::Start(
    grpc::CallbackServerContext* ctx, const v1::WatchEventsRequest& request,
    const absl::StatusOr<Caller>& caller) {
  // A Unix peer counts by uid across its connections, a TCP peer by address.
  const std::string key = PeerKey(ctx->peer(), options_.peer_uids);
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    auto peer = per_peer_.find(key);
    if (!caller.ok()) {
      refused = caller.status();
    } else if (shutting_down_) {
      refused = absl::UnavailableError("watch_events: kvarenad is shutting down");
    } else if (int(streams_.size()) >= options_.max_watchers) {
      refused = RefusedError(Refusal::kMaxWatchers,
                             absl::StrCat("watch_events: ", streams_.size(),
                                          " streams are open; at most ", options_.max_watchers));
    } else if (!key.empty() && peer != per_peer_.end() &&
               peer->second >= options_.max_watchers_per_peer) {
      refused = RefusedError(Refusal::kMaxWatchersPerPeer,
                             absl::StrCat("watch_events: ", key, " holds ", peer->second,
                                          " WatchEvents streams; max_watchers_per_peer=",
                                          options_.max_watchers_per_peer));
    } else {
      auto* stream = new EventsStream(this, ctx, request.from_seq(), key, *caller);
      streams_.insert(stream);
      live_.fetch_add(1);  // before the replay: an event recorded after it wakes the stream
      if (!key.empty()) ++per_peer_[key];
      stream->Poke(/*first=*/true);  // under mu_: no event slips between the replay and the stream
      return stream;
    }
  }
  rpcs_->RecordStreamEnd(Rpc::kWatchEvents, refused);
  return new RefusedWatch(refused);
}

void EventsHub::EventsRecorded() {
  if (live_.load() == 0 || wake_asked_.exchange(true)) return;
  absl::MutexLock lock(&wake_mu_);
  pending_ = true;
}

void EventsHub::Dispatch() {
  for (;;) {
    {
      absl::MutexLock lock(&wake_mu_);
      wake_mu_.Await(absl::Condition(this, &EventsHub::WakeLocked));
      if (stopping_) return;
      pending_ = false;
      wake_asked_.store(false);  // before the walk: what is recorded during it wakes us again
    }
    absl::MutexLock lock(&mu_);
    for (EventsStream* stream : streams_) stream->Poke(/*first=*/false);
  }
}

void EventsHub::BeginShutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  for (EventsStream* stream : streams_)
    stream->End(absl::UnavailableError("watch_events: kvarenad is shutting down"));
}

void EventsHub::Done(EventsStream* stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
  live_.fetch_sub(1);
  if (auto it = per_peer_.find(stream->peer_key()); it != per_peer_.end() && --it->second == 0) {
    per_peer_.erase(it);
  }
}

}  // namespace kvarena
