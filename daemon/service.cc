#include "daemon/service.h"

#include <algorithm>
#include <chrono>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "daemon/bearer_token.h"
#include "daemon/status.h"
#include "kernels/stop_token.h"
#include "proto/wire.h"

namespace kvarena {
namespace {

std::optional<absl::string_view> MetadataOf(const grpc::ServerContextBase* ctx,
                                            absl::string_view key) {
  const auto& md = ctx->client_metadata();
  const auto it = md.find(grpc::string_ref(key.data(), key.size()));
  if (it == md.end()) return std::nullopt;
  return absl::string_view(it->second.data(), it->second.size());
}

// Stops a served call's kernels once its deadline passed or its caller cancelled it.
// IsCancelled() is asked at most once a millisecond.
StopToken StopTokenOf(const grpc::CallbackServerContext* ctx) {
  const auto deadline = ctx->deadline();
  return StopToken(
      deadline == std::chrono::system_clock::time_point::max() ? absl::InfiniteFuture()
                                                               : absl::FromChrono(deadline),
      [ctx] { return ctx->IsCancelled(); }, absl::Milliseconds(1));
}

// A tensor's payload bytes, inline or shared.
uint64_t PayloadBytes(const v1::Tensor& t) {
  return t.has_shared() ? t.shared().length() : uint64_t(t.data().size());
}

}  // namespace

bool RunsInline(const v1::AppendRequest& req) {
  const uint64_t k = PayloadBytes(req.k()), v = PayloadBytes(req.v());
  return k <= kInlineAppendBytes && v <= kInlineAppendBytes - k;
}

bool RunsInline(const v1::AttendRequest& req) {
  const auto& shape = req.q().shape();
  if (shape.size() != 4 || req.pos() > kInlineAttendWork) return false;
  // [1, heads, queries, head_dim] x (pos + queries) keys, each factor bounded first.
  absl::uint128 work = req.pos() + uint64_t(std::max<int64_t>(shape[2], 0));
  for (const int64_t d : shape) {
    if (d < 0 || uint64_t(d) > kInlineAttendWork) return false;
    work *= uint64_t(d);
    if (work > kInlineAttendWork) return false;
  }
  return true;
}

namespace {

// The caches a Reserve or Commit names.
template <typename Request>
absl::InlinedVector<absl::string_view, 1> ItemCaches(const Request& req) {
  absl::InlinedVector<absl::string_view, 1> ids;
  ids.reserve(size_t(req.items_size()));
  for (const auto& item : req.items()) ids.push_back(item.cache_id());
  return ids;
}

}  // namespace

bool RunsInline(const v1::AllocateRequest& req, bool tiers) {
  if (tiers && req.prompt_tokens_size() > 0) return false;
  return req.prompt_tokens_size() <= kInlineTokens;
}
bool RunsInline(const v1::SetTokensRequest& req) { return req.token_ids_size() <= kInlineTokens; }
bool RunsInline(const v1::ReserveRequest& req) { return req.items_size() <= kInlineItems; }
bool RunsInline(const v1::CommitRequest& req) { return req.items_size() <= kInlineItems; }

KvCacheServiceImpl::KvCacheServiceImpl(KvStore* store, RpcMetrics* rpcs, AttachHub* attach,
                                       EventsHub* events, const ServiceOptions& options)
    : requests_(store),
      rpcs_(rpcs),
      attach_(attach),
      events_(events),
      tenants_(options.tenants),
      tiers_(options.tiers),
      offload_(kOffloadThreads, options.max_queued_bytes) {
  SetMessageAllocatorFor_Stats(&stats_messages_);
  SetMessageAllocatorFor_Describe(&describe_messages_);
  SetMessageAllocatorFor_ListCaches(&list_messages_);
}

absl::StatusOr<Caller> KvCacheServiceImpl::CallerOf(const grpc::ServerContextBase* ctx) const {
  Caller caller;
  caller.session = std::string(MetadataOf(ctx, kSessionMetadataKey).value_or(""));
  // kvarenad accepts its Unix sockets itself and hands each connection to gRPC, which
  // names such peers "fd:N" (daemon/unix_listener.h); "unix:" if gRPC accepted it.
  const std::string peer = ctx->peer();
  caller.unix_socket = absl::StartsWith(peer, "fd:") || absl::StartsWith(peer, "unix:");
  if (tenants_ == nullptr) return caller;
  KVARENA_ASSIGN_OR_RETURN(const Tenant* tenant,
                           tenants_->Authenticate(MetadataOf(ctx, kAuthorizationMetadataKey)));
  caller.tenant = tenant;
  return caller;
}

template <typename Body>
KvCacheServiceImpl::Unary* KvCacheServiceImpl::Serve(Rpc rpc, Ctx* ctx,
                                                     const google::protobuf::Message& req,
                                                     bool small, CacheIds caches, Body body) {
  const auto start = std::chrono::steady_clock::now();
  Unary* reactor = ctx->DefaultReactor();
  if (small && !busy_.Busy(caches)) {
    reactor->Finish(Run(rpc, ctx, start, body));
    return reactor;
  }
  busy_.Hold(caches);
  const absl::Status queued = offload_.Run(
      uint64_t(req.SpaceUsedLong()), [this, rpc, ctx, start, reactor, body, caches]() mutable {
        grpc::Status status = Run(rpc, ctx, start, body);
        busy_.Release(caches);
        reactor->Finish(std::move(status));
      });
  if (!queued.ok()) {  // refused before anything ran: the call mutated nothing
    busy_.Release(caches);
    rpcs_->RecordCall(rpc, queued, absl::FromChrono(std::chrono::steady_clock::now() - start));
    reactor->Finish(ToGrpcStatus(queued));
  }
  return reactor;
}

template <typename Body>
grpc::Status KvCacheServiceImpl::Run(Rpc rpc, const Ctx* ctx,
                                     std::chrono::steady_clock::time_point start, Body& body) {
  absl::Status status;
  // The budgets bound what a request may make the daemon hold; should the machine still
  // run out of memory, the call is refused rather than the daemon aborted.
  try {
    absl::StatusOr<Caller> caller = CallerOf(ctx);
    status = caller.ok() ? body(*caller) : caller.status();
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("kvarenad is out of memory; retry later or ask for less");
  }
  rpcs_->RecordCall(rpc, status, absl::FromChrono(std::chrono::steady_clock::now() - start));
  return ToGrpcStatus(status);
}

// Each body captures the call's pointers by value: one handed to the pool runs after its
// handler returned (gRPC keeps ctx, req and resp until the call is done).

KvCacheServiceImpl::Unary* KvCacheServiceImpl::Allocate(Ctx* ctx, const v1::AllocateRequest* req,
                                                        v1::AllocateResponse* resp) {
  return Serve(Rpc::kAllocate, ctx, *req, RunsInline(*req, tiers_), {},
               [this, req, resp](const Caller& c) { return requests_.Allocate(c, *req, resp); });
}

KvCacheServiceImpl::Unary* KvCacheServiceImpl::Append(Ctx* ctx, const v1::AppendRequest* req,
                                                      v1::AppendResponse* resp) {
  return Serve(Rpc::kAppend, ctx, *req, RunsInline(*req), {req->cache_id()},
               [this, req, resp](const Caller& c) { return requests_.Append(c, *req, resp); });
}

KvCacheServiceImpl::Unary* KvCacheServiceImpl::Attend(Ctx* ctx, const v1::AttendRequest* req,
                                                      v1::AttendResponse* resp) {
  return Serve(Rpc::kAttend, ctx, *req, RunsInline(*req), {req->cache_id()},
               [this, ctx, req, resp](const Caller& c) {
                 const StopToken stop = StopTokenOf(ctx);
                 return requests_.Attend(c, *req, resp, &stop);
               });
}

KvCacheServiceImpl::Unary* KvCacheServiceImpl::Popn(Ctx* ctx, const v1::PopnRequest* req,
                                                    v1::PopnResponse* resp) {
  return Serve(Rpc::kPopn, ctx, *req, true, {req->cache_id()},
               [this, req, resp](const Caller& c) { return requests_.Popn(c, *req, resp); });
}

KvCacheServiceImpl::Unary* KvCacheServiceImpl::Reset(Ctx* ctx, const v1::ResetRequest* req,
                                                     v1::ResetResponse* resp) {
  return Serve(Rpc::kReset, ctx, *req, true, {req->cache_id()},
               [this, req, resp](const Caller& c) { return requests_.Reset(c, *req, resp); });
}

KvCacheServiceImpl::Unary* KvCacheServiceImpl::Release(Ctx* ctx, const v1::ReleaseRequest* req,
                                                       v1::ReleaseResponse* resp) {
  return Serve(Rpc::kRelease, ctx, *req, true, {req->cache_id()},
               [this, req, resp](const Caller& c) { return requests_.Release(c, *req, resp); });
}

KvCacheServiceImpl::Unary* KvCacheServiceImpl::Reserve(Ctx* ctx, const v1::ReserveRequest* req,
                                                       v1::ReserveResponse* resp) {
  return Serve(Rpc::kReserve, ctx, *req, RunsInline(*req), ItemCaches(*req),
               [this, req, resp](const Caller& c) { return requests_.Reserve(c, *req, resp); });
}

KvCacheServiceImpl::Unary* KvCacheServiceImpl::Commit(Ctx* ctx, const v1::CommitRequest* req,
                                                      v1::CommitResponse* resp) {
  return Serve(Rpc::kCommit, ctx, *req, RunsInline(*req), ItemCaches(*req),
               [this, req, resp](const Caller& c) { return requests_.Commit(c, *req, resp); });
}

KvCacheServiceImpl::Unary* KvCacheServiceImpl::GetKv(Ctx* ctx, const v1::GetKvRequest* req,
                                                     v1::GetKvResponse* resp) {
  return Serve(Rpc::kGetKv, ctx, *req, false, {req->cache_id()},
               [this, req, resp](const Caller& c) { return requests_.GetKv(c, *req, resp); });
}

KvCacheServiceImpl::Unary* KvCacheServiceImpl::Describe(Ctx* ctx, const v1::DescribeRequest* req,
                                                        v1::DescribeResponse* resp) {
  return Serve(Rpc::kDescribe, ctx, *req, true, {req->cache_id()},
               [this, req, resp](const Caller& c) { return requests_.Describe(c, *req, resp); });
}

KvCacheServiceImpl::Unary* KvCacheServiceImpl::Stats(Ctx* ctx, const v1::StatsRequest* req,
                                                     v1::StatsResponse* resp) {
  return Serve(Rpc::kStats, ctx, *req, true, {req->cache_id()},
               [this, req, resp](const Caller& c) { return requests_.Stats(c, *req, resp); });
}

KvCacheServiceImpl::Unary* KvCacheServiceImpl::ListCaches(Ctx* ctx,
                                                          const v1::ListCachesRequest* req,
                                                          v1::ListCachesResponse* resp) {
  return Serve(Rpc::kListCaches, ctx, *req, false, {},
               [this, req, resp](const Caller& c) { return requests_.ListCaches(c, *req, resp); });
}

grpc::ServerWriteReactor<v1::AttachEvent>* KvCacheServiceImpl::Attach(
    Ctx* ctx, const v1::AttachRequest* req) {
  return attach_->Start(ctx, *req, CallerOf(ctx));
}

KvCacheServiceImpl::Unary* KvCacheServiceImpl::SetTokens(Ctx* ctx, const v1::SetTokensRequest* req,
                                                         v1::SetTokensResponse* resp) {
  return Serve(Rpc::kSetTokens, ctx, *req, RunsInline(*req), {req->cache_id()},
               [this, req, resp](const Caller& c) { return requests_.SetTokens(c, *req, resp); });
}

KvCacheServiceImpl::Unary* KvCacheServiceImpl::Fork(Ctx* ctx, const v1::ForkRequest* req,
                                                    v1::ForkResponse* resp) {
  return Serve(Rpc::kFork, ctx, *req, true, {req->cache_id()},
               [this, req, resp](const Caller& c) { return requests_.Fork(c, *req, resp); });
}

grpc::ServerWriteReactor<v1::WatchEventsResponse>* KvCacheServiceImpl::WatchEvents(
    Ctx* ctx, const v1::WatchEventsRequest* req) {
  return events_->Start(ctx, *req, CallerOf(ctx));
}

KvCacheServiceImpl::Unary* KvCacheServiceImpl::Ping(Ctx* ctx, const v1::PingRequest* req,
                                                    v1::PingResponse*) {
  return Serve(Rpc::kPing, ctx, *req, true, {}, [](const Caller&) { return absl::OkStatus(); });
}

}  // namespace kvarena
