#include "daemon/service.h"

#include <chrono>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/status.h"
#include "kernels/stop_token.h"
#include "proto/wire.h"

namespace kvarena {
namespace {

std::string SessionOf(const grpc::ServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  const auto it = md.find(kSessionMetadataKey);
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
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

template <typename Body>
grpc::Status KvCacheServiceImpl::Serve(Rpc rpc, Body body) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status status;
  // The budgets bound what a request may make the daemon hold; should the machine still
  // run out of memory, the call is refused rather than the daemon aborted.
  try {
    status = body();
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("kvarenad is out of memory; retry later or ask for less");
  }
  rpcs_->RecordCall(rpc, status, absl::FromChrono(std::chrono::steady_clock::now() - start));
  return ToGrpcStatus(status);
}

grpc::Status KvCacheServiceImpl::Allocate(Ctx* ctx, const v1::AllocateRequest* req,
                                          v1::AllocateResponse* resp) {
  return Serve(Rpc::kAllocate, [&] { return requests_.Allocate(SessionOf(ctx), *req, resp); });
}

grpc::Status KvCacheServiceImpl::Append(Ctx* ctx, const v1::AppendRequest* req,
                                        v1::AppendResponse* resp) {
  return Serve(Rpc::kAppend, [&] { return requests_.Append(SessionOf(ctx), *req, resp); });
}

grpc::Status KvCacheServiceImpl::Attend(Ctx* ctx, const v1::AttendRequest* req,
                                        v1::AttendResponse* resp) {
  const StopToken stop = StopTokenOf(ctx);
  return Serve(Rpc::kAttend, [&] { return requests_.Attend(SessionOf(ctx), *req, resp, &stop); });
}

grpc::Status KvCacheServiceImpl::Popn(Ctx* ctx, const v1::PopnRequest* req,
                                      v1::PopnResponse* resp) {
  return Serve(Rpc::kPopn, [&] { return requests_.Popn(SessionOf(ctx), *req, resp); });
}

grpc::Status KvCacheServiceImpl::Reset(Ctx* ctx, const v1::ResetRequest* req,
                                       v1::ResetResponse* resp) {
  return Serve(Rpc::kReset, [&] { return requests_.Reset(SessionOf(ctx), *req, resp); });
}

grpc::Status KvCacheServiceImpl::Release(Ctx* ctx, const v1::ReleaseRequest* req,
                                         v1::ReleaseResponse* resp) {
  return Serve(Rpc::kRelease, [&] { return requests_.Release(SessionOf(ctx), *req, resp); });
}

grpc::Status KvCacheServiceImpl::Reserve(Ctx* ctx, const v1::ReserveRequest* req,
                                         v1::ReserveResponse* resp) {
  return Serve(Rpc::kReserve, [&] { return requests_.Reserve(SessionOf(ctx), *req, resp); });
}

grpc::Status KvCacheServiceImpl::Commit(Ctx* ctx, const v1::CommitRequest* req,
                                        v1::CommitResponse* resp) {
  return Serve(Rpc::kCommit, [&] { return requests_.Commit(SessionOf(ctx), *req, resp); });
}

grpc::Status KvCacheServiceImpl::GetKv(Ctx* ctx, const v1::GetKvRequest* req,
                                       v1::GetKvResponse* resp) {
  return Serve(Rpc::kGetKv, [&] { return requests_.GetKv(SessionOf(ctx), *req, resp); });
}

grpc::Status KvCacheServiceImpl::Describe(Ctx* ctx, const v1::DescribeRequest* req,
                                          v1::DescribeResponse* resp) {
  return Serve(Rpc::kDescribe, [&] { return requests_.Describe(SessionOf(ctx), *req, resp); });
}

grpc::Status KvCacheServiceImpl::Stats(Ctx*, const v1::StatsRequest* req,
                                       v1::StatsResponse* resp) {
  return Serve(Rpc::kStats, [&] { return requests_.Stats(*req, resp); });
}

grpc::Status KvCacheServiceImpl::ListCaches(Ctx*, const v1::ListCachesRequest* req,
                                            v1::ListCachesResponse* resp) {
  return Serve(Rpc::kListCaches, [&] { return requests_.ListCaches(*req, resp); });
}

grpc::ServerWriteReactor<v1::AttachEvent>* KvCacheServiceImpl::Attach(
    grpc::CallbackServerContext* ctx, const v1::AttachRequest* req) {
  return attach_->Start(ctx, *req);
}

grpc::Status KvCacheServiceImpl::SetTokens(Ctx* ctx, const v1::SetTokensRequest* req,
                                           v1::SetTokensResponse* resp) {
  return Serve(Rpc::kSetTokens, [&] { return requests_.SetTokens(SessionOf(ctx), *req, resp); });
}

grpc::Status KvCacheServiceImpl::Fork(Ctx* ctx, const v1::ForkRequest* req, v1::ForkResponse* resp) {
  return Serve(Rpc::kFork, [&] { return requests_.Fork(SessionOf(ctx), *req, resp); });
}

grpc::ServerWriteReactor<v1::WatchEventsResponse>* KvCacheServiceImpl::WatchEvents(
    grpc::CallbackServerContext* ctx, const v1::WatchEventsRequest* req) {
  return events_->Start(ctx, *req);
}

grpc::Status KvCacheServiceImpl::Ping(Ctx*, const v1::PingRequest*, v1::PingResponse*) {
  return Serve(Rpc::kPing, [&] { return absl::OkStatus(); });
}

}  // namespace kvarena
