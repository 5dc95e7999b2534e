// RemoteTransport's calls that carry protobuf fields only (client/remote_transport.h):
// each builds its request, makes one unary call through the RemoteChannel and decodes
// the reply (proto/wire.h); SetTokens, Popn and GetKv first refuse the negative values
// their unsigned fields cannot carry. The calls with tensor bytes or mapped pages have a
// rule more and live in remote_tensor_calls.cc and remote_pool_calls.cc.
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/remote_transport.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvarena/v1/kvarena.grpc.pb.h"
#include "proto/wire.h"

namespace kvarena::client_internal {

absl::StatusOr<CacheInfo> RemoteTransport::Allocate(const CacheSpec& spec,
                                                    const std::string& cache_id,
                                                    const AllocateOptions& options) {
  v1::AllocateRequest req;
  ToProto(spec, req.mutable_spec());
  req.set_cache_id(cache_id);
  req.mutable_prompt_tokens()->Assign(options.prompt_tokens.begin(), options.prompt_tokens.end());
  v1::AllocateResponse resp;
  KVARENA_RETURN_IF_ERROR(channel_.Call(&Stub::Allocate, req, &resp));
  return FromProto(resp.cache());
}

absl::StatusOr<CacheInfo> RemoteTransport::SetTokens(const SetTokensArgs& args) {
  if (args.first_pos < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("set_tokens: first_pos=", args.first_pos, " is negative"));
  }
  v1::SetTokensRequest req;
  req.set_cache_id(args.cache_id);
  req.set_first_pos(uint64_t(args.first_pos));
  req.mutable_token_ids()->Assign(args.token_ids.begin(), args.token_ids.end());
  v1::SetTokensResponse resp;
  KVARENA_RETURN_IF_ERROR(channel_.Call(&Stub::SetTokens, req, &resp));
  return FromProto(resp.cache());
}

absl::StatusOr<CacheInfo> RemoteTransport::Fork(const std::string& cache_id,
                                                const std::string& new_cache_id) {
  v1::ForkRequest req;
  req.set_cache_id(cache_id);
  req.set_new_cache_id(new_cache_id);
  v1::ForkResponse resp;
  KVARENA_RETURN_IF_ERROR(channel_.Call(&Stub::Fork, req, &resp));
  return FromProto(resp.cache());
}

absl::StatusOr<PopnResult> RemoteTransport::Popn(const std::string& cache_id, int64_t n) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("popn: n=", n, " is negative"));
  }
  v1::PopnRequest req;
  req.set_cache_id(cache_id);
  req.set_n(uint64_t(n));
  v1::PopnResponse resp;
  KVARENA_RETURN_IF_ERROR(channel_.Call(&Stub::Popn, req, &resp));
  PopnResult r;
  r.popped = int64_t(resp.popped());
  r.seq_len = int64_t(resp.seq_len());
  r.refusal = resp.refusal();
  return r;
}

absl::StatusOr<CacheInfo> RemoteTransport::Reset(const std::string& cache_id, bool keep_pages) {
  v1::ResetRequest req;
  req.set_cache_id(cache_id);
  req.set_keep_pages(keep_pages);
  v1::ResetResponse resp;
  KVARENA_RETURN_IF_ERROR(channel_.Call(&Stub::Reset, req, &resp));
  return FromProto(resp.cache());
}

absl::Status RemoteTransport::Release(const std::string& cache_id) {
  v1::ReleaseRequest req;
  req.set_cache_id(cache_id);
  v1::ReleaseResponse resp;
  return channel_.Call(&Stub::Release, req, &resp);
}

absl::StatusOr<GetKvResult> RemoteTransport::GetKv(const std::string& cache_id, int layer,
                                                   const GetKvRange& range) {
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
  req.set_raw(range.raw);
  v1::GetKvResponse resp;
  KVARENA_RETURN_IF_ERROR(channel_.Call(&Stub::GetKv, req, &resp));
  GetKvResult r;
  r.k = TensorOutFromProto(resp.k());
  r.v = TensorOutFromProto(resp.v());
  r.first_pos = int64_t(resp.first_pos());
  r.layer_len = int64_t(resp.layer_len());
  r.kv_format = FromProto(resp.kv_format());
  if (resp.has_k_scales()) r.k_scales = TensorOutFromProto(resp.k_scales());
  if (resp.has_v_scales()) r.v_scales = TensorOutFromProto(resp.v_scales());
  return r;
}

absl::StatusOr<std::vector<CacheInfo>> RemoteTransport::Commit(
    const std::vector<CacheTokens>& items) {
  ++counters().commit;
  v1::CommitRequest req;
  for (const CacheTokens& item : items) ToProto(item, req.add_items());
  v1::CommitResponse resp;
  KVARENA_RETURN_IF_ERROR(channel_.Call(&Stub::Commit, req, &resp));
  std::vector<CacheInfo> out;
  for (const v1::CacheInfo& c : resp.caches()) out.push_back(FromProto(c));
  return out;
}

absl::StatusOr<ArenaStats> RemoteTransport::Stats() {
  v1::StatsRequest req;
  v1::StatsResponse resp;
  KVARENA_RETURN_IF_ERROR(channel_.Call(&Stub::Stats, req, &resp));
  return FromProto(resp);
}

absl::StatusOr<PageStats> RemoteTransport::CacheStats(const std::string& cache_id) {
  v1::StatsRequest req;
  req.set_cache_id(cache_id);
  v1::StatsResponse resp;
  KVARENA_RETURN_IF_ERROR(channel_.Call(&Stub::Stats, req, &resp));
  return FromProto(resp.pages());
}

absl::StatusOr<std::vector<CacheInfo>> RemoteTransport::ListCaches() {
  // Page after page (the daemon's default page size) until a page gives no next token.
  std::vector<CacheInfo> caches;
  v1::ListCachesRequest req;
  do {
    v1::ListCachesResponse resp;
    KVARENA_RETURN_IF_ERROR(channel_.Call(&Stub::ListCaches, req, &resp));
    for (const v1::CacheInfo& c : resp.caches()) caches.push_back(FromProto(c));
    if (!resp.next_page_token().empty() && resp.next_page_token() == req.page_token()) {
      return absl::InternalError("list_caches: the daemon gave the same page token twice");
    }
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  return caches;
}

absl::StatusOr<ServingStatus> RemoteTransport::Health(const std::string& service) {
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::ClientContext ctx;
  channel_.Prepare(&ctx);
  std::shared_ptr<const RemoteChannel::Stubs> stubs = channel_.GetStubs();
  if (stubs == nullptr) return DisconnectedStatus();
  KVARENA_RETURN_IF_ERROR(channel_.Finish(stubs->health->Check(&ctx, req, &resp)));
  return static_cast<ServingStatus>(resp.status());
}

absl::Status RemoteTransport::Ping() {
  v1::PingRequest req;
  v1::PingResponse resp;
  return channel_.Call(&Stub::Ping, req, &resp);
}

}  // namespace kvarena::client_internal
