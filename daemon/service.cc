#include "daemon/service.h"

#include <chrono>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/bearer_token.h"
#include "daemon/status.h"
#include "kernels/stop_token.h"
#include "proto/wire.h"

namespace kvarena {
namespace {

std::optional<absl::string_view> MetadataOf(const grpc::ServerContextBase* ctx, absl::string_view key) {
  const auto& md = ctx->client_metadata();
  const auto it = md.find(grpc::string_ref(key.data(), key.size()));
  if (it == md.end()) return std::nullopt;
  return absl::string_view(it->second.data(), it->second.size());
}

// Stops a served call's kernels once its deadline passed or its caller cancelled it.
// IsCancelled() plucks the call's completion queue: asked at most once a millisecond.
StopToken StopTokenOf(const grpc::ServerContext* ctx) {
  const auto deadline = ctx->deadline();
  return StopToken(deadline == std::chrono::system_clock::time_point::max() ? absl::InfiniteFuture()
                                                                           : absl::FromChrono(deadline),
                   [ctx] { return ctx->IsCancelled(); }, absl::Milliseconds(1));
}

}  // namespace

absl::StatusOr<Caller> KvCacheServiceImpl::CallerOf(const grpc::ServerContextBase* ctx) const {
  Caller caller;
  caller.session = std::string(MetadataOf(ctx, kSessionMetadataKey).value_or(""));
  // kvarenad accepts its Unix sockets itself and hands each connection to gRPC, which
  // names such peers "fd:N" (daemon/unix_listener.h); "unix:" if gRPC accepted it.
  const std::string peer = ctx->peer();
  caller.unix_socket = absl::StartsWith(peer, "fd:") || absl::StartsWith(peer, "unix:");
  if (tenants_ == nullptr) return caller;
  absl::StatusOr<const Tenant*> tenant = tenants_->Authenticate(MetadataOf(ctx, kAuthorizationMetadataKey));
  if (!tenant.ok()) return tenant.status();
  caller.tenant = *tenant;
  return caller;
}

template <typename Body>
grpc::Status KvCacheServiceImpl::Serve(Rpc rpc, const grpc::ServerContextBase* ctx, Body body) {
  const auto start = std::chrono::steady_clock::now();
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

grpc::Status KvCacheServiceImpl::Allocate(Ctx* ctx, const v1::AllocateRequest* req,
                                          v1::AllocateResponse* resp) {
  return Serve(Rpc::kAllocate, ctx, [&](const Caller& c) { return requests_.Allocate(c, *req, resp); });
}

grpc::Status KvCacheServiceImpl::Append(Ctx* ctx, const v1::AppendRequest* req,
                                        v1::AppendResponse* resp) {
  return Serve(Rpc::kAppend, ctx, [&](const Caller& c) { return requests_.Append(c, *req, resp); });
}

grpc::Status KvCacheServiceImpl::Attend(Ctx* ctx, const v1::AttendRequest* req,
                                        v1::AttendResponse* resp) {
  const StopToken stop = StopTokenOf(ctx);
  return Serve(Rpc::kAttend, ctx, [&](const Caller& c) { return requests_.Attend(c, *req, resp, &stop); });
}

grpc::Status KvCacheServiceImpl::Popn(Ctx* ctx, const v1::PopnRequest* req,
                                      v1::PopnResponse* resp) {
  return Serve(Rpc::kPopn, ctx, [&](const Caller& c) { return requests_.Popn(c, *req, resp); });
}

grpc::Status KvCacheServiceImpl::Reset(Ctx* ctx, const v1::ResetRequest* req,
                                       v1::ResetResponse* resp) {
  return Serve(Rpc::kReset, ctx, [&](const Caller& c) { return requests_.Reset(c, *req, resp); });
}

grpc::Status KvCacheServiceImpl::Release(Ctx* ctx, const v1::ReleaseRequest* req,
                                         v1::ReleaseResponse* resp) {
  return Serve(Rpc::kRelease, ctx, [&](const Caller& c) { return requests_.Release(c, *req, resp); });
}

grpc::Status KvCacheServiceImpl::Reserve(Ctx* ctx, const v1::ReserveRequest* req,
                                         v1::ReserveResponse* resp) {
  return Serve(Rpc::kReserve, ctx, [&](const Caller& c) { return requests_.Reserve(c, *req, resp); });
}

grpc::Status KvCacheServiceImpl::Commit(Ctx* ctx, const v1::CommitRequest* req,
                                        v1::CommitResponse* resp) {
  return Serve(Rpc::kCommit, ctx, [&](const Caller& c) { return requests_.Commit(c, *req, resp); });
}

grpc::Status KvCacheServiceImpl::GetKv(Ctx* ctx, const v1::GetKvRequest* req,
                                       v1::GetKvResponse* resp) {
  return Serve(Rpc::kGetKv, ctx, [&](const Caller& c) { return requests_.GetKv(c, *req, resp); });
}

grpc::Status KvCacheServiceImpl::Describe(Ctx* ctx, const v1::DescribeRequest* req,
                                          v1::DescribeResponse* resp) {
  return Serve(Rpc::kDescribe, ctx, [&](const Caller& c) { return requests_.Describe(c, *req, resp); });
}

grpc::Status KvCacheServiceImpl::Stats(Ctx* ctx, const v1::StatsRequest* req,
                                       v1::StatsResponse* resp) {
  return Serve(Rpc::kStats, ctx, [&](const Caller& c) { return requests_.Stats(c, *req, resp); });
}

grpc::Status KvCacheServiceImpl::ListCaches(Ctx* ctx, const v1::ListCachesRequest* req,
                                            v1::ListCachesResponse* resp) {
  return Serve(Rpc::kListCaches, ctx,
               [&](const Caller& c) { return requests_.ListCaches(c, *req, resp); });
}

grpc::ServerWriteReactor<v1::AttachEvent>* KvCacheServiceImpl::Attach(
    grpc::CallbackServerContext* ctx, const v1::AttachRequest* req) {
  return attach_->Start(ctx, *req, CallerOf(ctx));
}

grpc::Status KvCacheServiceImpl::SetTokens(Ctx* ctx, const v1::SetTokensRequest* req,
                                           v1::SetTokensResponse* resp) {
  return Serve(Rpc::kSetTokens, ctx, [&](const Caller& c) { return requests_.SetTokens(c, *req, resp); });
}

grpc::Status KvCacheServiceImpl::Fork(Ctx* ctx, const v1::ForkRequest* req, v1::ForkResponse* resp) {
  return Serve(Rpc::kFork, ctx, [&](const Caller& c) { return requests_.Fork(c, *req, resp); });
}

grpc::ServerWriteReactor<v1::WatchEventsResponse>* KvCacheServiceImpl::WatchEvents(
    grpc::CallbackServerContext* ctx, const v1::WatchEventsRequest* req) {
  return events_->Start(ctx, *req, CallerOf(ctx));
}

grpc::Status KvCacheServiceImpl::Ping(Ctx* ctx, const v1::PingRequest*, v1::PingResponse*) {
  return Serve(Rpc::kPing, ctx, [&](const Caller&) { return absl::OkStatus(); });
}

}  // namespace kvarena
