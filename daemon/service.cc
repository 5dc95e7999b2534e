#include "daemon/service.h"

#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/call_tensors.h"
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

absl::StatusOr<AttendArgs> DecodeAttend(const v1::AttendRequest& req, CallTensors* tensors) {
  AttendArgs args;
  args.cache_id = req.cache_id();
  args.layer = static_cast<int>(req.layer());
  args.pos = static_cast<int64_t>(req.pos());
  for (auto [field, from, to] : {std::tuple("attend: q", &req.q(), &args.q),
                                 std::tuple("attend: k", &req.k(), &args.k),
                                 std::tuple("attend: v", &req.v(), &args.v)}) {
    absl::StatusOr<TensorArg> t = tensors->In(field, *from);
    if (!t.ok()) return t.status();
    *to = *std::move(t);
  }
  args.scale = req.scale();
  args.window = req.window();
  return args;
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

std::vector<CacheTokens> FromProto(
    const google::protobuf::RepeatedPtrField<v1::CacheTokens>& items) {
  std::vector<CacheTokens> out;
  out.reserve(items.size());
  for (const v1::CacheTokens& item : items) out.push_back(kvarena::FromProto(item));
  return out;
}

void ToProto(const std::vector<LayerPages>& layers,
             google::protobuf::RepeatedPtrField<v1::LayerPages>* out) {
  for (size_t i = 0; i < layers.size(); ++i) {
    kvarena::ToProto(layers[i], static_cast<uint32_t>(i), out->Add());
  }
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
  absl::StatusOr<CacheInfo> info =
      store_->Allocate(SessionOf(ctx), FromProto(req->spec()), req->cache_id());
  if (info.ok()) ToProto(*info, resp->mutable_cache());
  return Done(Rpc::kAllocate, info.status());
}

grpc::Status KvCacheServiceImpl::Append(Ctx* ctx, const v1::AppendRequest* req,
                                        v1::AppendResponse* resp) {
  const std::string session = SessionOf(ctx);
  CallTensors tensors(store_, session);
  absl::StatusOr<TensorArg> k = tensors.In("append: k", req->k());
  if (!k.ok()) return Done(Rpc::kAppend, k.status());
  absl::StatusOr<TensorArg> v = tensors.In("append: v", req->v());
  if (!v.ok()) return Done(Rpc::kAppend, v.status());
  absl::StatusOr<AppendResult> r =
      store_->Append(session, req->cache_id(), static_cast<int>(req->layer()),
                     static_cast<int64_t>(req->pos()), *k, *v);
  if (r.ok()) {
    resp->set_layer_len(static_cast<uint64_t>(r->layer_len));
    resp->set_seq_len(static_cast<uint64_t>(r->seq_len));
  }
  return Done(Rpc::kAppend, r.status());
}

grpc::Status KvCacheServiceImpl::Attend(Ctx* ctx, const v1::AttendRequest* req,
                                        v1::AttendResponse* resp) {
  const std::string session = SessionOf(ctx);
  CallTensors tensors(store_, session);
  absl::StatusOr<AttendArgs> args = DecodeAttend(*req, &tensors);
  if (!args.ok()) return Done(Rpc::kAttend, args.status());
  size_t out_bytes = 0;
  absl::StatusOr<void*> out = tensors.Out(*req, args->q, resp->mutable_out(), &out_bytes);
  if (!out.ok()) return Done(Rpc::kAttend, out.status());
  absl::StatusOr<AttendResult> r = store_->Attend(session, *args, *out, out_bytes);
  if (r.ok()) resp->set_seq_len(static_cast<uint64_t>(r->seq_len));
  return Done(Rpc::kAttend, r.status());
}

grpc::Status KvCacheServiceImpl::Popn(Ctx* ctx, const v1::PopnRequest* req,
                                      v1::PopnResponse* resp) {
  absl::StatusOr<PopnResult> r =
      store_->Popn(SessionOf(ctx), req->cache_id(), req->n());
  if (r.ok()) {
    resp->set_popped(static_cast<uint64_t>(r->popped));
    resp->set_seq_len(static_cast<uint64_t>(r->seq_len));
    resp->set_refusal(r->refusal);
  }
  return Done(Rpc::kPopn, r.status());
}

grpc::Status KvCacheServiceImpl::Reset(Ctx* ctx, const v1::ResetRequest* req,
                                       v1::ResetResponse* resp) {
  absl::StatusOr<CacheInfo> info =
      store_->Reset(SessionOf(ctx), req->cache_id(), req->keep_pages());
  if (info.ok()) ToProto(*info, resp->mutable_cache());
  return Done(Rpc::kReset, info.status());
}

grpc::Status KvCacheServiceImpl::Release(Ctx* ctx, const v1::ReleaseRequest* req,
                                         v1::ReleaseResponse*) {
  return Done(Rpc::kRelease, store_->Release(SessionOf(ctx), req->cache_id()));
}

grpc::Status KvCacheServiceImpl::Reserve(Ctx* ctx, const v1::ReserveRequest* req,
                                         v1::ReserveResponse* resp) {
  absl::StatusOr<std::vector<ReserveResult>> r =
      store_->Reserve(SessionOf(ctx), FromProto(req->items()));
  if (r.ok()) {
    for (const ReserveResult& res : *r) ToProto(res, resp->add_caches());
  }
  return Done(Rpc::kReserve, r.status());
}

grpc::Status KvCacheServiceImpl::Commit(Ctx* ctx, const v1::CommitRequest* req,
                                        v1::CommitResponse* resp) {
  absl::StatusOr<std::vector<CacheInfo>> r =
      store_->Commit(SessionOf(ctx), FromProto(req->items()));
  if (r.ok()) {
    for (const CacheInfo& info : *r) ToProto(info, resp->add_caches());
  }
  return Done(Rpc::kCommit, r.status());
}

grpc::Status KvCacheServiceImpl::GetKv(Ctx* ctx, const v1::GetKvRequest* req,
                                       v1::GetKvResponse* resp) {
  const GetKvRange range{static_cast<int64_t>(req->from_pos()),
                         static_cast<int64_t>(req->max_tokens())};
  absl::StatusOr<GetKvResult> r =
      store_->GetKv(SessionOf(ctx), req->cache_id(), static_cast<int>(req->layer()), range);
  if (r.ok()) {
    ToProto(std::move(r->k), resp->mutable_k());
    ToProto(std::move(r->v), resp->mutable_v());
    resp->set_first_pos(static_cast<uint64_t>(r->first_pos));
    resp->set_layer_len(static_cast<uint64_t>(r->layer_len));
  }
  return Done(Rpc::kGetKv, r.status());
}

grpc::Status KvCacheServiceImpl::Describe(Ctx* ctx, const v1::DescribeRequest* req,
                                          v1::DescribeResponse* resp) {
  absl::StatusOr<CacheDescription> d = store_->Describe(SessionOf(ctx), req->cache_id());
  if (d.ok()) {
    ToProto(d->info, resp->mutable_cache());
    ToProto(d->layers, resp->mutable_layers());
  }
  return Done(Rpc::kDescribe, d.status());
}

grpc::Status KvCacheServiceImpl::Stats(Ctx*, const v1::StatsRequest* req,
                                       v1::StatsResponse* resp) {
  if (req->cache_id().empty()) {
    ToProto(store_->Stats(), resp);
    return Done(Rpc::kStats, absl::OkStatus());
  }
  absl::StatusOr<PageStats> s = store_->CacheStats(req->cache_id());
  if (s.ok()) ToProto(*s, resp->mutable_pages());
  return Done(Rpc::kStats, s.status());
}

grpc::Status KvCacheServiceImpl::ListCaches(Ctx*, const v1::ListCachesRequest*,
                                            v1::ListCachesResponse* resp) {
  for (const CacheInfo& info : store_->ListCaches()) ToProto(info, resp->add_caches());
  return Done(Rpc::kListCaches, absl::OkStatus());
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
