#include "daemon/requests.h"

#include <cstdint>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "daemon/call_tensors.h"
#include "daemon/decode.h"
#include "proto/wire.h"

namespace kvarena {
namespace {

// A call's CacheInfo as the caller names it, into its reply; or its refusal, so named.
absl::Status ReplyCache(const TenantScope& scope, absl::StatusOr<CacheInfo> info,
                        v1::CacheInfo* out) {
  if (!info.ok()) return scope.Out(info.status());
  scope.Out(&*info);
  ToProto(*info, out);
  return absl::OkStatus();
}

absl::StatusOr<AttendArgs> DecodeAttend(const v1::AttendRequest& req, const TenantScope& scope,
                                        CallTensors* tensors) {
  AttendArgs args;
  args.cache_id = scope.CacheIn(req.cache_id());
  KVARENA_ASSIGN_OR_RETURN(int layer, DecodeLayer("attend", req.layer()));
  args.layer = layer;
  KVARENA_ASSIGN_OR_RETURN(int64_t pos, DecodeInt64("attend", "pos", req.pos()));
  args.pos = pos;
  for (auto [field, from, to] :
       {std::tuple("attend: q", &req.q(), &args.q), std::tuple("attend: k", &req.k(), &args.k),
        std::tuple("attend: v", &req.v(), &args.v)}) {
    KVARENA_ASSIGN_OR_RETURN(TensorArg t, tensors->In(field, *from));
    *to = std::move(t);
  }
  args.scale = req.scale();
  args.window = req.window();
  return args;
}

// Each item's cache id for core.
std::vector<CacheTokens> ScopeItems(const TenantScope& scope, std::vector<CacheTokens> items) {
  for (CacheTokens& item : items) item.cache_id = scope.CacheIn(item.cache_id);
  return items;
}

void ToProto(const std::vector<LayerPages>& layers,
             google::protobuf::RepeatedPtrField<v1::LayerPages>* out) {
  for (size_t i = 0; i < layers.size(); ++i) {
    kvarena::ToProto(layers[i], static_cast<uint32_t>(i), out->Add());
  }
}

}  // namespace

std::string Requests::SessionOf(const Caller& caller, const TenantScope& scope) const {
  if (!scope.tenanted() || caller.session.empty() ||
      store_->SessionOwnedBy(caller.session, scope.owner())) {
    return caller.session;
  }
  return std::string(1, kTenantSeparator);  // no session has it: core's "unknown session"
}

std::string Requests::NewCacheId(const TenantScope& scope, const std::string& requested) const {
  if (!scope.tenanted() || !requested.empty()) return scope.CacheIn(requested);
  // 64 random bits: a clash with one of the tenant's ids is ALREADY_EXISTS, as for any id.
  thread_local std::mt19937_64 bits{std::random_device{}()};
  return scope.CacheIn(absl::StrCat("cache-", absl::Hex(bits(), absl::kZeroPad16)));
}

absl::Status Requests::Allocate(S caller, const v1::AllocateRequest& req,
                                v1::AllocateResponse* resp) {
  const TenantScope scope(caller.tenant);
  KVARENA_RETURN_IF_ERROR(scope.CheckWrite("allocate"));
  KVARENA_ASSIGN_OR_RETURN(CacheSpec spec, DecodeSpec(req.spec()));
  spec.prefix_namespace = scope.NamespaceIn(spec.prefix_namespace);
  AllocateOptions options;
  options.prompt_tokens.assign(req.prompt_tokens().begin(), req.prompt_tokens().end());
  absl::StatusOr<CacheInfo> info = store_->Allocate(
      SessionOf(caller, scope), spec, NewCacheId(scope, req.cache_id()), options, scope.owner());
  return ReplyCache(scope, std::move(info), resp->mutable_cache());
}

absl::Status Requests::SetTokens(S caller, const v1::SetTokensRequest& req,
                                 v1::SetTokensResponse* resp) {
  const TenantScope scope(caller.tenant);
  KVARENA_RETURN_IF_ERROR(scope.CheckWrite("set_tokens"));
  KVARENA_ASSIGN_OR_RETURN(int64_t first_pos,
                           DecodeInt64("set_tokens", "first_pos", req.first_pos()));
  SetTokensArgs args{scope.CacheIn(req.cache_id()), first_pos,
                     std::vector<int32_t>(req.token_ids().begin(), req.token_ids().end())};
  absl::StatusOr<CacheInfo> info = store_->SetTokens(SessionOf(caller, scope), args);
  return ReplyCache(scope, std::move(info), resp->mutable_cache());
}

absl::Status Requests::Fork(S caller, const v1::ForkRequest& req, v1::ForkResponse* resp) {
  const TenantScope scope(caller.tenant);
  KVARENA_RETURN_IF_ERROR(scope.CheckWrite("fork"));
  absl::StatusOr<CacheInfo> info =
      store_->Fork(SessionOf(caller, scope), scope.CacheIn(req.cache_id()),
                   NewCacheId(scope, req.new_cache_id()));
  return ReplyCache(scope, std::move(info), resp->mutable_cache());
}

absl::Status Requests::Append(S caller, const v1::AppendRequest& req, v1::AppendResponse* resp) {
  const TenantScope scope(caller.tenant);
  KVARENA_RETURN_IF_ERROR(scope.CheckWrite("append"));
  KVARENA_ASSIGN_OR_RETURN(int layer, DecodeLayer("append", req.layer()));
  KVARENA_ASSIGN_OR_RETURN(int64_t pos, DecodeInt64("append", "pos", req.pos()));
  const std::string session = SessionOf(caller, scope);
  CallTensors tensors(store_, session);
  KVARENA_ASSIGN_OR_RETURN(TensorArg k, tensors.In("append: k", req.k()));
  KVARENA_ASSIGN_OR_RETURN(TensorArg v, tensors.In("append: v", req.v()));
  absl::StatusOr<AppendResult> r =
      store_->Append(session, scope.CacheIn(req.cache_id()), layer, pos, k, v);
  if (!r.ok()) return scope.Out(r.status());
  resp->set_layer_len(static_cast<uint64_t>(r->layer_len));
  resp->set_seq_len(static_cast<uint64_t>(r->seq_len));
  return absl::OkStatus();
}

absl::Status Requests::Attend(S caller, const v1::AttendRequest& req, v1::AttendResponse* resp,
                              const StopToken* stop) {
  const TenantScope scope(caller.tenant);
  KVARENA_RETURN_IF_ERROR(scope.CheckWrite("attend"));
  const std::string session = SessionOf(caller, scope);
  CallTensors tensors(store_, session);
  KVARENA_ASSIGN_OR_RETURN(AttendArgs args, DecodeAttend(req, scope, &tensors));
  size_t out_bytes = 0;
  KVARENA_ASSIGN_OR_RETURN(void* out, tensors.Out(req, args.q, resp->mutable_out(), &out_bytes));
  absl::StatusOr<AttendResult> r = store_->Attend(session, args, out, out_bytes, stop);
  if (!r.ok()) return scope.Out(r.status());
  resp->set_seq_len(static_cast<uint64_t>(r->seq_len));
  return absl::OkStatus();
}

absl::Status Requests::Popn(S caller, const v1::PopnRequest& req, v1::PopnResponse* resp) {
  const TenantScope scope(caller.tenant);
  KVARENA_RETURN_IF_ERROR(scope.CheckWrite("popn"));
  absl::StatusOr<PopnResult> r =
      store_->Popn(SessionOf(caller, scope), scope.CacheIn(req.cache_id()), req.n());
  if (!r.ok()) return scope.Out(r.status());
  resp->set_popped(static_cast<uint64_t>(r->popped));
  resp->set_seq_len(static_cast<uint64_t>(r->seq_len));
  resp->set_refusal(r->refusal);
  return absl::OkStatus();
}

absl::Status Requests::Reset(S caller, const v1::ResetRequest& req, v1::ResetResponse* resp) {
  const TenantScope scope(caller.tenant);
  KVARENA_RETURN_IF_ERROR(scope.CheckWrite("reset"));
  absl::StatusOr<CacheInfo> info =
      store_->Reset(SessionOf(caller, scope), scope.CacheIn(req.cache_id()), req.keep_pages());
  return ReplyCache(scope, std::move(info), resp->mutable_cache());
}

absl::Status Requests::Release(S caller, const v1::ReleaseRequest& req, v1::ReleaseResponse*) {
  const TenantScope scope(caller.tenant);
  KVARENA_RETURN_IF_ERROR(scope.CheckWrite("release"));
  return scope.Out(store_->Release(SessionOf(caller, scope), scope.CacheIn(req.cache_id())));
}

absl::Status Requests::Reserve(S caller, const v1::ReserveRequest& req, v1::ReserveResponse* resp) {
  const TenantScope scope(caller.tenant);
  KVARENA_RETURN_IF_ERROR(scope.CheckWrite("reserve"));
  KVARENA_ASSIGN_OR_RETURN(std::vector<CacheTokens> items, DecodeItems("reserve", req.items()));
  absl::StatusOr<std::vector<ReserveResult>> r =
      store_->Reserve(SessionOf(caller, scope), ScopeItems(scope, std::move(items)));
  if (!r.ok()) return scope.Out(r.status());
  for (ReserveResult& res : *r) {
    res.cache_id = scope.Out(res.cache_id);
    ToProto(res, resp->add_caches());
  }
  return absl::OkStatus();
}

absl::Status Requests::Commit(S caller, const v1::CommitRequest& req, v1::CommitResponse* resp) {
  const TenantScope scope(caller.tenant);
  KVARENA_RETURN_IF_ERROR(scope.CheckWrite("commit"));
  KVARENA_ASSIGN_OR_RETURN(std::vector<CacheTokens> items, DecodeItems("commit", req.items()));
  absl::StatusOr<std::vector<CacheInfo>> r =
      store_->Commit(SessionOf(caller, scope), ScopeItems(scope, std::move(items)));
  if (!r.ok()) return scope.Out(r.status());
  for (CacheInfo& info : *r) {
    scope.Out(&info);
    ToProto(info, resp->add_caches());
  }
  return absl::OkStatus();
}

absl::Status Requests::GetKv(S caller, const v1::GetKvRequest& req, v1::GetKvResponse* resp) {
  const TenantScope scope(caller.tenant);
  KVARENA_RETURN_IF_ERROR(scope.CheckWrite("get_kv"));  // the operator sees no tenant's K/V
  absl::StatusOr<int> layer = DecodeLayer("get_kv", req.layer());
  KVARENA_RETURN_IF_ERROR(layer.status());
  GetKvRange range;
  KVARENA_ASSIGN_OR_RETURN(range.from_pos, DecodeInt64("get_kv", "from_pos", req.from_pos()));
  KVARENA_ASSIGN_OR_RETURN(range.max_tokens, DecodeInt64("get_kv", "max_tokens", req.max_tokens()));
  range.raw = req.raw();
  absl::StatusOr<GetKvResult> r =
      store_->GetKv(SessionOf(caller, scope), scope.CacheIn(req.cache_id()), *layer, range);
  if (!r.ok()) return scope.Out(r.status());
  ToProto(std::move(r->k), resp->mutable_k());
  ToProto(std::move(r->v), resp->mutable_v());
  resp->set_first_pos(static_cast<uint64_t>(r->first_pos));
  resp->set_layer_len(static_cast<uint64_t>(r->layer_len));
  resp->set_kv_format(ToProto(r->kv_format));
  if (!r->k_scales.shape.empty()) ToProto(std::move(r->k_scales), resp->mutable_k_scales());
  if (!r->v_scales.shape.empty()) ToProto(std::move(r->v_scales), resp->mutable_v_scales());
  return absl::OkStatus();
}

absl::Status Requests::Describe(S caller, const v1::DescribeRequest& req,
                                v1::DescribeResponse* resp) {
  const TenantScope scope(caller.tenant);
  // The operator describes as a sessionless caller: any cache no session owns.
  absl::StatusOr<CacheDescription> d =
      store_->Describe(SessionOf(caller, scope), scope.CacheIn(req.cache_id()));
  if (!d.ok()) return scope.Out(d.status());
  scope.Out(&d->info);
  ToProto(d->info, resp->mutable_cache());
  ToProto(d->layers, resp->mutable_layers());
  return absl::OkStatus();
}

absl::Status Requests::Stats(S caller, const v1::StatsRequest& req, v1::StatsResponse* resp) {
  const TenantScope scope(caller.tenant);
  if (req.cache_id().empty()) {
    ArenaStats stats = store_->Stats();
    // A tenant sees its own pools (the operator every tenant's, each named by its tenant).
    if (!scope.sees_all()) {
      std::erase_if(stats.pools, [&scope](const PoolStats& p) { return p.owner != scope.owner(); });
    }
    ToProto(stats, resp);
    return absl::OkStatus();
  }
  absl::StatusOr<PageStats> s = store_->CacheStats(scope.CacheIn(req.cache_id()));
  if (!s.ok()) return scope.Out(s.status());
  ToProto(*s, resp->mutable_pages());
  return absl::OkStatus();
}

absl::Status Requests::ListCaches(S caller, const v1::ListCachesRequest& req,
                                  v1::ListCachesResponse* resp) {
  const TenantScope scope(caller.tenant);
  const bool all_names = SeesAllNames(caller);
  KVARENA_ASSIGN_OR_RETURN(std::string after, DecodePageToken(req.page_token()));
  // Pages go in core's id order, and the token names a core id. A tenant's ids are
  // contiguous there (they share its prefix): its pages start at the prefix and end with
  // the first id that is not its own.
  std::string cursor = after;
  if (!scope.sees_all()) cursor = std::max(cursor, scope.CacheIn(""));
  const KvStore::CachePage page = store_->ListCaches(cursor, DecodePageSize(req.page_size()));
  bool more = page.more;
  for (CacheInfo info : page.caches) {
    if (!scope.Sees(info.cache_id)) {
      more = false;
      break;
    }
    if (!all_names && !store_->SessionOwnsCache(caller.session, info.cache_id)) {
      info.spec.prefix_namespace.clear();  // another's salt: it would let the caller adopt
    }
    scope.Out(&info);
    ToProto(info, resp->add_caches());
  }
  if (more) resp->set_next_page_token(EncodePageToken(page.last_id));
  return absl::OkStatus();
}

}  // namespace kvarena
