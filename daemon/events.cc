#include "daemon/events.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"

#include "absl/strings/str_cat.h"
#include "daemon/status.h"
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

// One live WatchEvents stream: at most one write in flight; what is recorded meanwhile
// goes in the next write. State guarded by mu_; gRPC is called under it (it runs no
// reaction inline).
class EventsStream final : public grpc::ServerWriteReactor<v1::WatchEventsResponse> {
 public:
  EventsStream(EventsHub* hub, uint64_t from_seq, const Caller& caller)
      : hub_(hub), scope_(caller.tenant), all_names_(SeesAllNames(caller)), next_(from_seq) {}

  void Poke(bool first) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_ || end_.has_value() || writing_) return;
    WriteLocked(first);
  }

  void End(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_ || end_.has_value()) return;
    if (writing_) {
      end_ = std::move(status);
      return;
    }
    FinishLocked(status);
  }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (end_.has_value()) return FinishLocked(*end_);
    if (!ok) return FinishLocked(absl::CancelledError("watch_events: the client went away"));
    WriteLocked(/*first=*/false);  // what was recorded during the write, if anything
  }

  void OnCancel() override { End(absl::CancelledError("watch_events: the client went away")); }

  void OnDone() override {
    hub_->Done(this);
    delete this;
  }

 private:
  void WriteLocked(bool first) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bool lost = false;
    std::vector<PrefixEvent> events = hub_->store_->PrefixEvents(next_, kMaxEventsPerMessage, &lost);
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
      if (p->has_stored()) p->mutable_stored()->set_medium(hub_->medium_);
    }
    response_.set_events_lost(lost);
    next_ = events.empty() ? std::max(next_, hub_->store_->NextPrefixEventSeq()) : events.back().seq + 1;
    response_.set_next_seq(next_);
    writing_ = true;
    StartWrite(&response_);
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

  void FinishLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finished_ = true;
    hub_->rpcs_->RecordStreamEnd(Rpc::kWatchEvents, status);
    Finish(ToGrpcStatus(status));
  }

  EventsHub* const hub_;
  const TenantScope scope_;
  const bool all_names_;  // else events go without namespaces and token ids
  absl::Mutex mu_;
  // A tenant's stream: the pages (pool, hash) it sent stored events for, not yet removed.
  absl::flat_hash_set<std::pair<uint64_t, Hash128>> seen_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_);  // the seq to send next (0: the oldest kept)
  v1::WatchEventsResponse response_ ABSL_GUARDED_BY(mu_);  // gRPC reads it while writing_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> end_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

EventsHub::EventsHub(const KvStore* store, RpcMetrics* rpcs, Options options)
    : store_(store), rpcs_(rpcs), options_(options), medium_(store->Medium()) {}

EventsHub::~EventsHub() = default;

grpc::ServerWriteReactor<v1::WatchEventsResponse>* EventsHub::Start(
    const v1::WatchEventsRequest& request, const absl::StatusOr<Caller>& caller) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (!caller.ok()) {
      refused = caller.status();
    } else if (shutting_down_) {
      refused = absl::UnavailableError("watch_events: kvarenad is shutting down");
    } else if (int(streams_.size()) >= options_.max_watchers) {
      refused = absl::ResourceExhaustedError(absl::StrCat("watch_events: ", streams_.size(),
                                                          " streams are open; at most ", options_.max_watchers));
    } else {
      auto* stream = new EventsStream(this, request.from_seq(), *caller);
      streams_.insert(stream);
      stream->Poke(/*first=*/true);  // under mu_: no event slips between the replay and the stream
      return stream;
    }
  }
  rpcs_->RecordStreamEnd(Rpc::kWatchEvents, refused);
  return new RefusedWatch(refused);
}

void EventsHub::EventsRecorded() {
  absl::MutexLock lock(&mu_);
  for (EventsStream* stream : streams_) stream->Poke(/*first=*/false);
}

void EventsHub::BeginShutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  for (EventsStream* stream : streams_) stream->End(absl::UnavailableError("watch_events: kvarenad is shutting down"));
}

void EventsHub::Done(EventsStream* stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
}

}  // namespace kvarena
