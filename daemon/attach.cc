#include "daemon/attach.h"

#include <optional>
#include <utility>
#include <vector>

#include <grpcpp/server_context.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/refusal.h"
#include "daemon/status.h"
#include "proto/wire.h"

namespace kvarena {
namespace {

// The session's regions as an AttachEvent (the id and the fd socket included).
absl::StatusOr<v1::AttachEvent> RegionsEvent(const KvStore& store, const std::string& session,
                                             const std::string& fd_socket) {
  absl::StatusOr<std::vector<RegionInfo>> regions = store.SessionRegions(session);
  if (!regions.ok()) return regions.status();
  v1::AttachEvent event;
  event.set_session_id(session);
  event.set_fd_socket(fd_socket);
  for (const RegionInfo& r : *regions) ToProto(r, event.add_regions());
  return event;
}

// An Attach call refused before it opened a session: finishes at once.
class RefusedAttach final : public grpc::ServerWriteReactor<v1::AttachEvent> {
 public:
  explicit RefusedAttach(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

// One live Attach stream: at most one write in flight; region changes during it are
// coalesced into one more write of the latest list, and an end during it waits for it.
// Its state is guarded by mu_; gRPC is called under mu_ (it runs no reaction inline).
class AttachStream final : public grpc::ServerWriteReactor<v1::AttachEvent> {
 public:
  AttachStream(AttachHub* hub, std::string session, std::string peer_host)
      : hub_(hub), session_(std::move(session)), peer_host_(std::move(peer_host)) {}

  const std::string& session() const { return session_; }
  const std::string& peer_host() const { return peer_host_; }

  // Sends the session's current region list, now or after the write in flight.
  void SendRegions() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_ || end_.has_value()) return;
    if (writing_) {
      stale_ = true;
      return;
    }
    WriteLocked();
  }

  // Finishes the stream with `status`, now or after the write in flight; the first end wins.
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
    if (!ok) return FinishLocked(absl::CancelledError("attach: the client went away"));
    if (stale_) {
      stale_ = false;
      WriteLocked();
    }
  }

  void OnCancel() override { End(absl::CancelledError("attach: the client went away")); }

  void OnDone() override {
    hub_->Done(this);
    delete this;
  }

 private:
  // Starts writing the current list unless it is the one last sent.
  void WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<v1::AttachEvent> event =
        RegionsEvent(*hub_->store_, session_, hub_->options_.fd_socket);
    if (!event.ok()) return FinishLocked(event.status());
    if (sent_any_ && event->SerializeAsString() == event_.SerializeAsString()) return;
    event_ = *std::move(event);
    sent_any_ = true;
    writing_ = true;
    StartWrite(&event_);
  }

  void FinishLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finished_ = true;
    hub_->rpcs_->RecordStreamEnd(Rpc::kAttach, status);
    Finish(ToGrpcStatus(status));
  }

  AttachHub* const hub_;
  const std::string session_;
  const std::string peer_host_;

  absl::Mutex mu_;
  v1::AttachEvent event_ ABSL_GUARDED_BY(mu_);  // the last one sent; gRPC reads it while writing_
  bool sent_any_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stale_ ABSL_GUARDED_BY(mu_) = false;     // the regions changed during the write
  std::optional<absl::Status> end_ ABSL_GUARDED_BY(mu_);  // to finish with after the write
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called
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

AttachHub::AttachHub(KvStore* store, RpcMetrics* rpcs, Options options)
    : store_(store), rpcs_(rpcs), options_(std::move(options)) {}

AttachHub::~AttachHub() = default;

grpc::ServerWriteReactor<v1::AttachEvent>* AttachHub::Start(grpc::CallbackServerContext* ctx,
                                                            const v1::AttachRequest& request) {
  const std::string host = PeerHost(ctx->peer());
  absl::Status refused;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) {
    refused = absl::UnavailableError("attach: kvarenad is shutting down");
  } else if (auto it = per_peer_.find(host);
             !host.empty() && it != per_peer_.end() && it->second >= options_.max_per_peer) {
    refused = RefusedError(Refusal::kMaxAttachPerPeer,
                           absl::StrCat("attach: peer ", host, " holds ", it->second,
                                        " Attach streams; max_attach_per_peer=",
                                        options_.max_per_peer));
  } else if (absl::StatusOr<std::string> session = store_->OpenSession(request.client_name());
             !session.ok()) {
    refused = session.status();
  } else {
    auto* stream = new AttachStream(this, *std::move(session), host);
    streams_.insert(stream);
    if (!host.empty()) ++per_peer_[host];
    // Under mu_, so no change of the regions slips between this list and the next event.
    stream->SendRegions();
    return stream;
  }
  rpcs_->RecordStreamEnd(Rpc::kAttach, refused);
  return new RefusedAttach(refused);
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
  store_->DetachSession(stream->session(), options_.session_grace);
}

}  // namespace kvarena
