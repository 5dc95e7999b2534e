#include "daemon/service.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/status.h"
#include "proto/wire.h"

namespace kvarena {
namespace {

std::string SessionOf(const grpc::ServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  const auto it = md.find(kSessionMetadataKey);
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

}  // namespace

grpc::Status KvCacheServiceImpl::Done(Rpc rpc, const absl::Status& status) {
  rpcs_->Count(rpc, status.code());
  return ToGrpcStatus(status);
}

grpc::Status KvCacheServiceImpl::Allocate(Ctx* ctx, const v1::AllocateRequest* req,
                                          v1::AllocateResponse* resp) {
  return Done(Rpc::kAllocate, requests_.Allocate(SessionOf(ctx), *req, resp));
}

grpc::Status KvCacheServiceImpl::Append(Ctx* ctx, const v1::AppendRequest* req,
                                        v1::AppendResponse* resp) {
  return Done(Rpc::kAppend, requests_.Append(SessionOf(ctx), *req, resp));
}

grpc::Status KvCacheServiceImpl::Attend(Ctx* ctx, const v1::AttendRequest* req,
                                        v1::AttendResponse* resp) {
  return Done(Rpc::kAttend, requests_.Attend(SessionOf(ctx), *req, resp));
}

grpc::Status KvCacheServiceImpl::Popn(Ctx* ctx, const v1::PopnRequest* req,
                                      v1::PopnResponse* resp) {
  return Done(Rpc::kPopn, requests_.Popn(SessionOf(ctx), *req, resp));
}

grpc::Status KvCacheServiceImpl::Reset(Ctx* ctx, const v1::ResetRequest* req,
                                       v1::ResetResponse* resp) {
  return Done(Rpc::kReset, requests_.Reset(SessionOf(ctx), *req, resp));
}

grpc::Status KvCacheServiceImpl::Release(Ctx* ctx, const v1::ReleaseRequest* req,
                                         v1::ReleaseResponse* resp) {
  return Done(Rpc::kRelease, requests_.Release(SessionOf(ctx), *req, resp));
}

grpc::Status KvCacheServiceImpl::Reserve(Ctx* ctx, const v1::ReserveRequest* req,
                                         v1::ReserveResponse* resp) {
  return Done(Rpc::kReserve, requests_.Reserve(SessionOf(ctx), *req, resp));
}

grpc::Status KvCacheServiceImpl::Commit(Ctx* ctx, const v1::CommitRequest* req,
                                        v1::CommitResponse* resp) {
  return Done(Rpc::kCommit, requests_.Commit(SessionOf(ctx), *req, resp));
}

grpc::Status KvCacheServiceImpl::GetKv(Ctx* ctx, const v1::GetKvRequest* req,
                                       v1::GetKvResponse* resp) {
  return Done(Rpc::kGetKv, requests_.GetKv(SessionOf(ctx), *req, resp));
}

grpc::Status KvCacheServiceImpl::Describe(Ctx* ctx, const v1::DescribeRequest* req,
                                          v1::DescribeResponse* resp) {
  return Done(Rpc::kDescribe, requests_.Describe(SessionOf(ctx), *req, resp));
}

grpc::Status KvCacheServiceImpl::Stats(Ctx*, const v1::StatsRequest* req,
                                       v1::StatsResponse* resp) {
  return Done(Rpc::kStats, requests_.Stats(*req, resp));
}

grpc::Status KvCacheServiceImpl::ListCaches(Ctx*, const v1::ListCachesRequest* req,
                                            v1::ListCachesResponse* resp) {
  return Done(Rpc::kListCaches, requests_.ListCaches(*req, resp));
}

grpc::ServerWriteReactor<v1::AttachEvent>* KvCacheServiceImpl::Attach(
    grpc::CallbackServerContext* ctx, const v1::AttachRequest* req) {
  return attach_->Start(ctx, *req);
}

grpc::Status KvCacheServiceImpl::SetTokens(Ctx* ctx, const v1::SetTokensRequest* req,
                                           v1::SetTokensResponse* resp) {
  return Done(Rpc::kSetTokens, requests_.SetTokens(SessionOf(ctx), *req, resp));
}

grpc::Status KvCacheServiceImpl::Fork(Ctx* ctx, const v1::ForkRequest* req, v1::ForkResponse* resp) {
  return Done(Rpc::kFork, requests_.Fork(SessionOf(ctx), *req, resp));
}

grpc::ServerWriteReactor<v1::WatchEventsResponse>* KvCacheServiceImpl::WatchEvents(
    grpc::CallbackServerContext*, const v1::WatchEventsRequest* req) {
  return events_->Start(*req);
}

grpc::Status KvCacheServiceImpl::Ping(Ctx*, const v1::PingRequest*, v1::PingResponse*) {
  return Done(Rpc::kPing, absl::OkStatus());
}

}  // namespace kvarena
