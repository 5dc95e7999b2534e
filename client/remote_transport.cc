// RemoteTransport: kvarenad over gRPC. One channel, with the credentials of
// client/channel_credentials.h (TLS, a bearer token) and message limits both ways of
// options.max_message_bytes; unary calls carry a deadline and the session metadata; with
// options.attach the session is held by an Attach stream (AttachedSession, which resumes
// it on a new stream when one breaks), and its loss marks the transport disconnected for
// good. Over a unix: address it also connects to the daemon's
// fd socket (AttachEvent.fd_socket): pools map into this process (MapPool: views and the
// local path; brought up to date after every Reserve and Describe, whose pages may lie in
// memory the daemon committed since) and q/k/v/out travel through the session's scratch
// region (ScratchLanes) unless options.inline_tensors. Each call settles its lane with
// its status, so a lane whose handler may still run is quarantined (scratch_lanes.h).
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/attached_session.h"
#include "client/channel_credentials.h"
#include "client/grpc_status.h"
#include "client/zero_copy.h"
#include "client/transport.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvarena/v1/kvarena.grpc.pb.h"
#include "core/validate.h"
#include "proto/wire.h"
#include <grpcpp/grpcpp.h>

namespace kvarena::client_internal {
namespace {

using Stub = v1::KvCacheService::Stub;

// One channel and its stubs, shared by the calls in flight.
struct Stubs {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<Stub> kv;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
};

class RemoteTransport final : public Transport {
 public:
  // credentials and args: from NewChannelCredentials.
  RemoteTransport(std::string address, const ClientOptions& options,
                  const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                  grpc::ChannelArguments args)
      : Transport(options), address_(std::move(address)), options_(options) {
    // Connect checked the bound; get_kv pages its replies below it.
    args.SetMaxReceiveMessageSize(int(options.max_message_bytes));
    // Reconnect to a daemon back after a break within about a second, well inside a
    // session grace (gRPC's default backoff grows to two minutes).
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetMaxSendMessageSize(int(options.max_message_bytes));
    auto stubs = std::make_shared<Stubs>();
    stubs->channel = grpc::CreateCustomChannel(address_, credentials, args);
    stubs->kv = v1::KvCacheService::NewStub(stubs->channel);
    stubs->health = grpc::health::v1::Health::NewStub(stubs->channel);
    stubs_ = std::move(stubs);
  }

  // The session goes first: its supervisor may call Disconnect, which uses mu_.
  ~RemoteTransport() override { session_.reset(); }

  // Opens the Attach stream and waits for its first event (the session id).
  absl::Status Attach() {
    session_ = std::make_unique<AttachedSession>(
        GetStubs()->channel, address_, options_, [this](const absl::Status& why) { Disconnect(why); });
    if (auto s = session_->Open(); !s.ok()) return s;
    attached_session_ = session_->session_id();
    return absl::OkStatus();
  }

  // Sets up the zero-copy data plane with the fd socket the first AttachEvent named.
  void ConnectRegions() {
    if (!options_.attach) {
      zero_copy_ = std::make_unique<ZeroCopy>("the client has no session (attach=false)");
      return;
    }
    zero_copy_ = ZeroCopy::Connect(address_, session_->fd_socket(), attached_session_,
                                   options_.inline_tensors);
  }

  // The backend's name, as Stats reports it, turned into a device name.
  absl::Status LearnDevice() {
    auto st = Stats();
    if (!st.ok()) return st.status();
    absl::MutexLock lock(&mu_);
    device_ = st->backend == "host" ? "cpu" : st->backend == "cuda" ? "cuda:0" : st->backend;
    return absl::OkStatus();
  }

  const std::string& address() const override { return address_; }
  std::string session_id() const override { return attached_session_; }
  bool is_inproc() const override { return false; }
  std::string device() override {
    {
      absl::MutexLock lock(&mu_);
      if (!device_.empty()) return device_;
    }
    absl::Status s = LearnDevice();
    absl::MutexLock lock(&mu_);
    return device_.empty() ? absl::StrCat("unknown (", s.message(), ")") : device_;
  }
  bool connected() const override { return connected_.load(); }
  int64_t resumes() const override { return session_ == nullptr ? 0 : session_->resumes(); }
  absl::Status DisconnectedStatus() const override {
    if (connected()) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    return absl::UnavailableError(absl::StrCat(
        kUnavailablePrefix, "the session's Attach stream to ", address_, " ended (",
        absl::StripPrefix(end_status_.message(), kUnavailablePrefix), "); session ",
        SessionIdForLog(attached_session_), " and its caches are gone; connect a new Client"));
  }

  absl::StatusOr<CacheInfo> Allocate(const CacheSpec& spec, const std::string& cache_id,
                                     const AllocateOptions& options) override {
    v1::AllocateRequest req;
    ToProto(spec, req.mutable_spec());
    req.set_cache_id(cache_id);
    req.mutable_prompt_tokens()->Assign(options.prompt_tokens.begin(), options.prompt_tokens.end());
    v1::AllocateResponse resp;
    if (auto s = Call(&Stub::Allocate, req, &resp); !s.ok()) return s;
    return FromProto(resp.cache());
  }

  absl::StatusOr<CacheInfo> SetTokens(const SetTokensArgs& args) override {
    if (args.first_pos < 0) {
      return absl::InvalidArgumentError(absl::StrCat("set_tokens: first_pos=", args.first_pos, " is negative"));
    }
    v1::SetTokensRequest req;
    req.set_cache_id(args.cache_id);
    req.set_first_pos(uint64_t(args.first_pos));
    req.mutable_token_ids()->Assign(args.token_ids.begin(), args.token_ids.end());
    v1::SetTokensResponse resp;
    if (auto s = Call(&Stub::SetTokens, req, &resp); !s.ok()) return s;
    return FromProto(resp.cache());
  }

  absl::StatusOr<CacheInfo> Fork(const std::string& cache_id, const std::string& new_cache_id) override {
    v1::ForkRequest req;
    req.set_cache_id(cache_id);
    req.set_new_cache_id(new_cache_id);
    v1::ForkResponse resp;
    if (auto s = Call(&Stub::Fork, req, &resp); !s.ok()) return s;
    return FromProto(resp.cache());
  }

  absl::StatusOr<AppendResult> Append(const std::string& cache_id, int layer, int64_t pos,
                                      const TensorArg& k, const TensorArg& v) override {
    v1::AppendRequest req;
    req.set_cache_id(cache_id);
    req.set_layer(layer);
    req.set_pos(pos);
    ScratchLanes::Lease lease = zero_copy_->Lease({k.bytes, v.bytes});
    ZeroCopy::EncodeTensor(k, &lease, req.mutable_k());
    ZeroCopy::EncodeTensor(v, &lease, req.mutable_v());
    v1::AppendResponse resp;
    absl::Status s = Call(&Stub::Append, req, &resp);
    lease.Settle(s);
    if (!s.ok()) return s;
    AppendResult r;
    r.layer_len = int64_t(resp.layer_len());
    r.seq_len = int64_t(resp.seq_len());
    return r;
  }

  absl::StatusOr<AttendResult> Attend(const AttendArgs& args, TensorOut* out) override {
    v1::AttendRequest req;
    req.set_cache_id(args.cache_id);
    req.set_layer(args.layer);
    req.set_pos(args.pos);
    // q, k, v and out all through one lane, or all inline.
    ScratchLanes::Lease lease =
        zero_copy_->Lease({args.q.bytes, args.k.bytes, args.v.bytes, args.q.bytes});
    ZeroCopy::EncodeTensor(args.q, &lease, req.mutable_q());
    // Absent k and v (attend over the cache) stay unset on the wire.
    if (Present(args.k)) ZeroCopy::EncodeTensor(args.k, &lease, req.mutable_k());
    if (Present(args.v)) ZeroCopy::EncodeTensor(args.v, &lease, req.mutable_v());
    v1::SharedSlice out_slice;
    const uint8_t* shared_out = lease ? lease.Take(args.q.bytes, &out_slice) : nullptr;
    if (shared_out != nullptr) *req.mutable_out() = out_slice;
    req.set_scale(args.scale);
    req.set_window(args.window);
    v1::AttendResponse resp;
    absl::Status s = Call(&Stub::Attend, req, &resp);
    lease.Settle(s);
    if (!s.ok()) return s;
    *out = TensorOutFromProto(resp.out());
    if (shared_out != nullptr) out->data.assign(reinterpret_cast<const char*>(shared_out), args.q.bytes);
    AttendResult r;
    r.out_shape = out->shape;
    r.seq_len = int64_t(resp.seq_len());
    return r;
  }

  absl::StatusOr<PopnResult> Popn(const std::string& cache_id, int64_t n) override {
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat("popn: n=", n, " is negative"));
    }
    v1::PopnRequest req;
    req.set_cache_id(cache_id);
    req.set_n(uint64_t(n));
    v1::PopnResponse resp;
    if (auto s = Call(&Stub::Popn, req, &resp); !s.ok()) return s;
    PopnResult r;
    r.popped = int64_t(resp.popped());
    r.seq_len = int64_t(resp.seq_len());
    r.refusal = resp.refusal();
    return r;
  }

  absl::StatusOr<CacheInfo> Reset(const std::string& cache_id, bool keep_pages) override {
    v1::ResetRequest req;
    req.set_cache_id(cache_id);
    req.set_keep_pages(keep_pages);
    v1::ResetResponse resp;
    if (auto s = Call(&Stub::Reset, req, &resp); !s.ok()) return s;
    return FromProto(resp.cache());
  }

  absl::Status Release(const std::string& cache_id) override {
    v1::ReleaseRequest req;
    req.set_cache_id(cache_id);
    v1::ReleaseResponse resp;
    return Call(&Stub::Release, req, &resp);
  }

  absl::StatusOr<GetKvResult> GetKv(const std::string& cache_id, int layer,
                                    const GetKvRange& range) override {
    if (range.from_pos < 0 || range.max_tokens < 0) {
      return absl::InvalidArgumentError(absl::StrCat("get_kv: from_pos=", range.from_pos,
                                                     " and max_tokens=", range.max_tokens,
                                                     " must be >= 0"));
    }
    v1::GetKvRequest req;
    req.set_cache_id(cache_id);
    req.set_layer(layer);
    req.set_from_pos(uint64_t(range.from_pos));
    req.set_max_tokens(uint64_t(range.max_tokens));
    v1::GetKvResponse resp;
    if (auto s = Call(&Stub::GetKv, req, &resp); !s.ok()) return s;
    GetKvResult r;
    r.k = TensorOutFromProto(resp.k());
    r.v = TensorOutFromProto(resp.v());
    r.first_pos = int64_t(resp.first_pos());
    r.layer_len = int64_t(resp.layer_len());
    return r;
  }

  absl::StatusOr<CacheDescription> Describe(const std::string& cache_id) override {
    ++counters().describe;
    v1::DescribeRequest req;
    req.set_cache_id(cache_id);
    v1::DescribeResponse resp;
    if (auto s = Call(&Stub::Describe, req, &resp); !s.ok()) return s;
    CacheDescription d;
    d.info = FromProto(resp.cache());
    d.layers.resize(d.info.spec.num_layers);
    for (const v1::LayerPages& p : resp.layers()) {
      if (p.layer() < d.layers.size()) d.layers[p.layer()] = FromProto(p);
    }
    if (auto s = zero_copy_->SyncPools(); !s.ok()) return s;  // the pages named are mapped
    return d;
  }

  absl::StatusOr<std::vector<ReserveResult>> Reserve(const std::vector<CacheTokens>& items) override {
    ++counters().reserve;
    v1::ReserveRequest req;
    for (const CacheTokens& item : items) ToProto(item, req.add_items());
    v1::ReserveResponse resp;
    if (auto s = Call(&Stub::Reserve, req, &resp); !s.ok()) return s;
    std::vector<ReserveResult> out;
    for (const v1::CacheReservation& c : resp.caches()) out.push_back(FromProto(c));
    // The reservation may have grown a pool: map its new memory before the pages are used.
    if (auto s = zero_copy_->SyncPools(); !s.ok()) return s;
    return out;
  }

  absl::StatusOr<std::vector<CacheInfo>> Commit(const std::vector<CacheTokens>& items) override {
    ++counters().commit;
    v1::CommitRequest req;
    for (const CacheTokens& item : items) ToProto(item, req.add_items());
    v1::CommitResponse resp;
    if (auto s = Call(&Stub::Commit, req, &resp); !s.ok()) return s;
    std::vector<CacheInfo> out;
    for (const v1::CacheInfo& c : resp.caches()) out.push_back(FromProto(c));
    return out;
  }

  absl::StatusOr<ArenaStats> Stats() override {
    v1::StatsRequest req;
    v1::StatsResponse resp;
    if (auto s = Call(&Stub::Stats, req, &resp); !s.ok()) return s;
    return FromProto(resp);
  }

  absl::StatusOr<PageStats> CacheStats(const std::string& cache_id) override {
    v1::StatsRequest req;
    req.set_cache_id(cache_id);
    v1::StatsResponse resp;
    if (auto s = Call(&Stub::Stats, req, &resp); !s.ok()) return s;
    return FromProto(resp.pages());
  }

  absl::StatusOr<std::vector<CacheInfo>> ListCaches() override {
    v1::ListCachesRequest req;
    v1::ListCachesResponse resp;
    if (auto s = Call(&Stub::ListCaches, req, &resp); !s.ok()) return s;
    std::vector<CacheInfo> caches;
    caches.reserve(resp.caches_size());
    for (const v1::CacheInfo& c : resp.caches()) caches.push_back(FromProto(c));
    return caches;
  }

  absl::StatusOr<ServingStatus> Health(const std::string& service) override {
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx);
    std::shared_ptr<const Stubs> stubs = GetStubs();
    if (stubs == nullptr) return DisconnectedStatus();
    if (auto s = Finish(stubs->health->Check(&ctx, req, &resp)); !s.ok()) return s;
    return static_cast<ServingStatus>(resp.status());
  }

  absl::Status Ping() override {
    v1::PingRequest req;
    v1::PingResponse resp;
    return Call(&Stub::Ping, req, &resp);
  }

  absl::StatusOr<MappedPool> MapPool(uint64_t pool_id) override {
    absl::StatusOr<RegionClient::Pool> p = zero_copy_->GetPool(pool_id, address_);
    if (!p.ok()) return p.status();
    return MappedPool{p->base, p->kind, p->device};
  }

  int TEST_QuarantinedLanes() const override { return zero_copy_->QuarantinedLanes(); }

 private:
  template <typename Req, typename Resp>
  absl::Status Call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
                    const Req& req, Resp* resp) {
    std::shared_ptr<const Stubs> stubs = GetStubs();
    if (stubs == nullptr) return DisconnectedStatus();
    grpc::ClientContext ctx;
    Prepare(&ctx);
    return Finish((stubs->kv.get()->*method)(&ctx, req, resp));
  }

  // The stubs, or null once disconnected. Calls hold their copy to the end.
  std::shared_ptr<const Stubs> GetStubs() const {
    absl::MutexLock lock(&mu_);
    return stubs_;
  }

  void Prepare(grpc::ClientContext* ctx) const {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
    // attached_session_ is written once, before Connect returns.
    if (!attached_session_.empty()) ctx->AddMetadata(kSessionMetadataKey, attached_session_);
  }

  absl::Status Finish(const grpc::Status& status) const {
    absl::Status s = FromGrpcStatus(status);
    if (s.code() == absl::StatusCode::kUnavailable) {
      return absl::UnavailableError(absl::StrCat(s.message(), " [", address_, "]"));
    }
    return s;
  }

  // The session is gone: calls fail with DisconnectedStatus from now on.
  void Disconnect(const absl::Status& why) {
    absl::MutexLock lock(&mu_);
    stubs_.reset();  // closes the channel once no call holds it
    end_status_ = why;
    connected_.store(false);
  }

  const std::string address_;
  const ClientOptions options_;

  std::string attached_session_;  // set once by Attach(), before the transport is shared
  std::atomic<bool> connected_{true};

  mutable absl::Mutex mu_;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  // Reset when the Attach stream ends: the connection closes and a draining daemon is
  // not kept waiting for it (it waits for its connections, not only for calls).
  std::shared_ptr<const Stubs> stubs_ ABSL_GUARDED_BY(mu_);
  std::string device_ ABSL_GUARDED_BY(mu_);

  // Set once by ConnectRegions, before the transport is shared.
  std::unique_ptr<ZeroCopy> zero_copy_;
  // Set once by Attach(); null without a session.
  std::unique_ptr<AttachedSession> session_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Transport>> NewRemoteTransport(const std::string& address,
                                                              const ClientOptions& options) {
  grpc::ChannelArguments args;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      NewChannelCredentials(address, options, &args);
  if (!credentials.ok()) return credentials.status();
  auto t = std::make_shared<RemoteTransport>(address, options, *credentials, std::move(args));
  if (options.attach) {
    if (auto s = t->Attach(); !s.ok()) return s;
    if (auto s = t->LearnDevice(); !s.ok()) return s;
  }
  t->ConnectRegions();
  return std::shared_ptr<Transport>(std::move(t));
}

}  // namespace kvarena::client_internal
