#include "daemon/service.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/status.h"
#include "proto/wire.h"

namespace kvarena {
namespace {

// How often a held Attach stream looks at its client and at shutdown.
constexpr absl::Duration kAttachPoll = absl::Milliseconds(50);

std::string SessionOf(const grpc::ServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  const auto it = md.find(kSessionMetadataKey);
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

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

}  // namespace

void KvCacheServiceImpl::BeginShutdown() {
  if (!shutting_down_.HasBeenNotified()) shutting_down_.Notify();
}

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

// Held for the worker's lifetime: the first event names the session and its regions; a
// further event follows whenever a pool appears (checked every kAttachPoll). The stream
// then waits for the client to go away (or the daemon to stop) and starts the grace.
grpc::Status KvCacheServiceImpl::Attach(Ctx* ctx, const v1::AttachRequest* req,
                                        grpc::ServerWriter<v1::AttachEvent>* writer) {
  if (shutting_down_.HasBeenNotified()) {
    return Done(Rpc::kAttach, absl::UnavailableError("attach: kvarenad is shutting down"));
  }
  const absl::StatusOr<std::string> opened = store_->OpenSession(req->client_name());
  if (!opened.ok()) return Done(Rpc::kAttach, opened.status());
  const std::string& session = *opened;
  const absl::StatusOr<v1::AttachEvent> first = RegionsEvent(*store_, session, fd_socket_);
  if (first.ok() && writer->Write(*first)) {
    int sent_regions = first->regions_size();
    while (!ctx->IsCancelled() && !shutting_down_.WaitForNotificationWithTimeout(kAttachPoll)) {
      absl::StatusOr<v1::AttachEvent> next = RegionsEvent(*store_, session, fd_socket_);
      if (!next.ok() || next->regions_size() == sent_regions) continue;
      sent_regions = next->regions_size();
      if (!writer->Write(*next)) break;
    }
  }
  store_->DetachSession(session, session_grace_);
  return Done(Rpc::kAttach, shutting_down_.HasBeenNotified()
                                ? absl::UnavailableError("attach: kvarenad is shutting down")
                                : first.status());
}

grpc::Status KvCacheServiceImpl::Ping(Ctx*, const v1::PingRequest*, v1::PingResponse*) {
  return Done(Rpc::kPing, absl::OkStatus());
}

}  // namespace kvarena
