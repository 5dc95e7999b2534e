#include "daemon/attach.h"

#include <grpcpp/server_context.h>

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "core/refusal.h"
#include "daemon/status.h"
#include "daemon/write_stream.h"
#include "proto/wire.h"

namespace kvarena {
namespace {

// The attachment's regions as an AttachEvent (the session, its resume token, the grace
// and the fd socket included).
absl::StatusOr<v1::AttachEvent> RegionsEvent(const KvStore& store, const SessionAttachment& a,
                                             const AttachHub::Options& options) {
  KVARENA_ASSIGN_OR_RETURN(std::vector<RegionInfo> regions, store.SessionRegions(a.session_id));
  v1::AttachEvent event;
  event.set_session_id(a.session_id);
  event.set_resume_token(a.resume_token);
  event.set_session_grace_ms(uint64_t(absl::ToInt64Milliseconds(options.session_grace)));
  event.set_resumed(a.resumed);
  event.set_daemon_incarnation(options.incarnation);
  event.set_fd_socket(options.fd_socket);
  for (const RegionInfo& r : regions) ToProto(r, event.add_regions());
  return event;
}

// Who opens a session: a TCP peer by its address (it cannot reach the fd socket, so its
// session gets no scratch region), a Unix-socket peer by its uid when `uids` knows it.
// Who opens a session: a TCP peer (it cannot map) by address, a Unix peer by uid, and the
// tenant it authenticated as (its owner, with the tenant's session bound).
SessionPeer SessionPeerOf(const std::string& peer, const std::string& host, const PeerUids* uids,
                          const TenantScope& scope, const Tenant* tenant) {
  SessionPeer p;
  p.can_map = host.empty();
  p.key = PeerKey(peer, uids);
  p.owner = scope.owner();
  p.owner_max_sessions = scope.tenanted() && tenant != nullptr ? tenant->max_sessions : 0;
  return p;
}

// Marks a call the daemon ends because it is shutting down (kAttachEndMetadataKey).
void MarkShutdown(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  if (absl::IsUnavailable(status))
    ctx->AddTrailingMetadata(kAttachEndMetadataKey, kAttachEndShutdown);
}

// An Attach call refused before it opened a session: finishes at once.
class RefusedAttach final : public grpc::ServerWriteReactor<v1::AttachEvent> {
 public:
  RefusedAttach(grpc::CallbackServerContext* ctx, const absl::Status& status) {
    MarkShutdown(ctx, status);
    Finish(ToGrpcStatus(status));
  }
  void OnDone() override { delete this; }
};

}  // namespace

// One live Attach stream on the write queue (daemon/write_stream.h): region changes during
// a write are coalesced into one more write of the latest list.
class AttachStream final : public WriteStream<v1::AttachEvent> {
 public:
  AttachStream(AttachHub* hub, grpc::CallbackServerContext* ctx, SessionAttachment attachment,
               std::string peer_host)
      : WriteStream(hub->rpcs_, Rpc::kAttach, "attach: the client went away"),
        hub_(hub),
        ctx_(ctx),
        attachment_(std::move(attachment)),
        peer_host_(std::move(peer_host)) {}

  const std::string& session() const { return attachment_.session_id; }
  uint64_t epoch() const { return attachment_.epoch; }
  const std::string& peer_host() const { return peer_host_; }

  // Sends the session's current region list, now or after the write in flight.
  void SendRegions() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (EndingLocked()) return;
    if (WritingLocked()) {
      stale_ = true;
      return;
    }
    WriteLocked();
  }

  void OnDone() override {
    hub_->Done(this);
    delete this;
  }

 private:
  // Starts writing the current list unless it is the one last sent.
  void WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<v1::AttachEvent> event =
        RegionsEvent(*hub_->store_, attachment_, hub_->options_);
    if (!event.ok()) return FinishLocked(event.status());
    if (sent_any_ && event->SerializeAsString() == event_.SerializeAsString()) return;
    event_ = *std::move(event);
    sent_any_ = true;
    StartWriteLocked(&event_);
  }

  void WriteNextLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stale_) {
      stale_ = false;
      WriteLocked();
    }
  }

  // UNAVAILABLE is the daemon shutting down: the end is marked so.
  void AddTrailersLocked(const absl::Status& status) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    MarkShutdown(ctx_, status);
  }

  AttachHub* const hub_;
  grpc::CallbackServerContext* const ctx_;  // gRPC's, valid until OnDone
  const SessionAttachment attachment_;
  const std::string peer_host_;

  v1::AttachEvent event_ ABSL_GUARDED_BY(mu_);  // the last one sent; gRPC reads it while writing
  bool sent_any_ ABSL_GUARDED_BY(mu_) = false;
  bool stale_ ABSL_GUARDED_BY(mu_) = false;  // the regions changed during the write
};

std::string PeerHost(absl::string_view peer) {
  if (absl::ConsumePrefix(&peer, "ipv4:")) return std::string(peer.substr(0, peer.rfind(':')));
  if (!absl::ConsumePrefix(&peer, "ipv6:")) return "";
  // "[::1]:5555", or percent-encoded as gRPC's URIs have it: "%5B::1%5D:5555".
  for (auto [open, close] : {std::pair("[", "]"), std::pair("%5B", "%5D")}) {
    if (absl::ConsumePrefix(&peer, open)) return std::string(peer.substr(0, peer.find(close)));
  }
  return std::string(peer);
}

std::string PeerKey(absl::string_view peer, const PeerUids* uids) {
  if (std::string host = PeerHost(peer); !host.empty()) return "peer " + host;
  if (std::optional<uid_t> uid = uids != nullptr ? uids->Find(peer) : std::nullopt;
      uid.has_value()) {
    return absl::StrCat("uid ", *uid);
  }
  return "";
}

AttachHub::AttachHub(KvStore* store, RpcMetrics* rpcs, Options options)
    : store_(store), rpcs_(rpcs), options_(std::move(options)) {}

AttachHub::~AttachHub() = default;

grpc::ServerWriteReactor<v1::AttachEvent>* AttachHub::Start(grpc::CallbackServerContext* ctx,
                                                            const v1::AttachRequest& request,
                                                            const absl::StatusOr<Caller>& caller) {
  const std::string host = PeerHost(ctx->peer());
  const TenantScope scope(caller.ok() ? caller->tenant : nullptr);
  absl::Status refused;
  absl::MutexLock lock(&mu_);
  if (!caller.ok()) {
    refused = caller.status();
  } else if (absl::Status write = scope.CheckWrite("attach"); !write.ok()) {
    refused = write;
  } else if (shutting_down_) {
    refused = absl::UnavailableError("attach: kvarenad is shutting down");
  } else if (auto it = per_peer_.find(host);
             !host.empty() && it != per_peer_.end() && it->second >= options_.max_per_peer) {
    refused =
        RefusedError(Refusal::kMaxAttachPerPeer,
                     absl::StrCat("attach: peer ", host, " holds ", it->second,
                                  " Attach streams; max_attach_per_peer=", options_.max_per_peer));
  } else if (absl::StatusOr<SessionAttachment> a =
                 store_->AttachSession(request.client_name(), request.resume_token(),
                                       SessionPeerOf(ctx->peer(), host, options_.peer_uids, scope,
                                                     caller.ok() ? caller->tenant : nullptr));
             !a.ok()) {
    refused = a.status();
  } else {
    if (a->resumed) {
      // The stream it takes over, if the daemon has not seen that one end yet.
      for (AttachStream* old : streams_) {
        if (old->session() == a->session_id) {
          old->End(absl::AbortedError("attach: the session was resumed by a newer Attach stream"));
        }
      }
    }
    auto* stream = new AttachStream(this, ctx, *std::move(a), host);
    streams_.insert(stream);
    if (!host.empty()) ++per_peer_[host];
    // Under mu_, so no change of the regions slips between this list and the next event.
    stream->SendRegions();
    return stream;
  }
  rpcs_->RecordStreamEnd(Rpc::kAttach, refused);
  return new RefusedAttach(ctx, refused);
}

void AttachHub::RegionsChanged() {
  absl::MutexLock lock(&mu_);
  for (AttachStream* stream : streams_) stream->SendRegions();
}

void AttachHub::BeginShutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  for (AttachStream* stream : streams_) {
    stream->End(absl::UnavailableError("attach: kvarenad is shutting down"));
  }
}

void AttachHub::Done(AttachStream* stream) {
  {
    absl::MutexLock lock(&mu_);
    streams_.erase(stream);
    if (auto it = per_peer_.find(stream->peer_host()); it != per_peer_.end() && --it->second == 0) {
      per_peer_.erase(it);
    }
  }
  // A no-op when a newer stream resumed the session meanwhile.
  store_->DetachSession(stream->session(), options_.session_grace, stream->epoch());
}

}  // namespace kvarena
