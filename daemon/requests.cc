#include "daemon/requests.h"

#include <tuple>
#include <utility>
#include <vector>

#include "core/status_macros.h"
#include "daemon/call_tensors.h"
#include "daemon/decode.h"
#include "proto/wire.h"

namespace kvarena {
namespace {

absl::StatusOr<AttendArgs> DecodeAttend(const v1::AttendRequest& req, CallTensors* tensors) {
  AttendArgs args;
  args.cache_id = req.cache_id();
  absl::StatusOr<int> layer = DecodeLayer("attend", req.layer());
  if (!layer.ok()) return layer.status();
  args.layer = *layer;
  absl::StatusOr<int64_t> pos = DecodeInt64("attend", "pos", req.pos());
  if (!pos.ok()) return pos.status();
  args.pos = *pos;
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

void ToProto(const std::vector<LayerPages>& layers,
             google::protobuf::RepeatedPtrField<v1::LayerPages>* out) {
  for (size_t i = 0; i < layers.size(); ++i) {
    kvarena::ToProto(layers[i], static_cast<uint32_t>(i), out->Add());
  }
}

}  // namespace

absl::Status Requests::Allocate(S session, const v1::AllocateRequest& req,
                                v1::AllocateResponse* resp) {
  absl::StatusOr<CacheSpec> spec = DecodeSpec(req.spec());
  if (!spec.ok()) return spec.status();
  AllocateOptions options;
  options.prompt_tokens.assign(req.prompt_tokens().begin(), req.prompt_tokens().end());
  absl::StatusOr<CacheInfo> info = store_->Allocate(session, *spec, req.cache_id(), options);
  if (info.ok()) ToProto(*info, resp->mutable_cache());
  return info.status();
}

absl::Status Requests::SetTokens(S session, const v1::SetTokensRequest& req,
                                 v1::SetTokensResponse* resp) {
  absl::StatusOr<int64_t> first_pos = DecodeInt64("set_tokens", "first_pos", req.first_pos());
  if (!first_pos.ok()) return first_pos.status();
  SetTokensArgs args{req.cache_id(), *first_pos,
                     std::vector<int32_t>(req.token_ids().begin(), req.token_ids().end())};
  absl::StatusOr<CacheInfo> info = store_->SetTokens(session, args);
  if (info.ok()) ToProto(*info, resp->mutable_cache());
  return info.status();
}

absl::Status Requests::Fork(S session, const v1::ForkRequest& req, v1::ForkResponse* resp) {
  absl::StatusOr<CacheInfo> info = store_->Fork(session, req.cache_id(), req.new_cache_id());
  if (info.ok()) ToProto(*info, resp->mutable_cache());
  return info.status();
}

absl::Status Requests::Append(S session, const v1::AppendRequest& req, v1::AppendResponse* resp) {
  absl::StatusOr<int> layer = DecodeLayer("append", req.layer());
  if (!layer.ok()) return layer.status();
  absl::StatusOr<int64_t> pos = DecodeInt64("append", "pos", req.pos());
  if (!pos.ok()) return pos.status();
  CallTensors tensors(store_, session);
  absl::StatusOr<TensorArg> k = tensors.In("append: k", req.k());
  if (!k.ok()) return k.status();
  absl::StatusOr<TensorArg> v = tensors.In("append: v", req.v());
  if (!v.ok()) return v.status();
  absl::StatusOr<AppendResult> r = store_->Append(session, req.cache_id(), *layer, *pos, *k, *v);
  if (!r.ok()) return r.status();
  resp->set_layer_len(static_cast<uint64_t>(r->layer_len));
  resp->set_seq_len(static_cast<uint64_t>(r->seq_len));
  return absl::OkStatus();
}

absl::Status Requests::Attend(S session, const v1::AttendRequest& req, v1::AttendResponse* resp,
                              const StopToken* stop) {
  CallTensors tensors(store_, session);
  absl::StatusOr<AttendArgs> args = DecodeAttend(req, &tensors);
  if (!args.ok()) return args.status();
  size_t out_bytes = 0;
  absl::StatusOr<void*> out = tensors.Out(req, args->q, resp->mutable_out(), &out_bytes);
  if (!out.ok()) return out.status();
  absl::StatusOr<AttendResult> r = store_->Attend(session, *args, *out, out_bytes, stop);
  if (!r.ok()) return r.status();
  resp->set_seq_len(static_cast<uint64_t>(r->seq_len));
  return absl::OkStatus();
}

absl::Status Requests::Popn(S session, const v1::PopnRequest& req, v1::PopnResponse* resp) {
  absl::StatusOr<PopnResult> r = store_->Popn(session, req.cache_id(), req.n());
  if (!r.ok()) return r.status();
  resp->set_popped(static_cast<uint64_t>(r->popped));
  resp->set_seq_len(static_cast<uint64_t>(r->seq_len));
  resp->set_refusal(r->refusal);
  return absl::OkStatus();
}

absl::Status Requests::Reset(S session, const v1::ResetRequest& req, v1::ResetResponse* resp) {
  absl::StatusOr<CacheInfo> info = store_->Reset(session, req.cache_id(), req.keep_pages());
  if (info.ok()) ToProto(*info, resp->mutable_cache());
  return info.status();
}

absl::Status Requests::Release(S session, const v1::ReleaseRequest& req, v1::ReleaseResponse*) {
  return store_->Release(session, req.cache_id());
}

absl::Status Requests::Reserve(S session, const v1::ReserveRequest& req, v1::ReserveResponse* resp) {
  absl::StatusOr<std::vector<CacheTokens>> items = DecodeItems("reserve", req.items());
  if (!items.ok()) return items.status();
  absl::StatusOr<std::vector<ReserveResult>> r = store_->Reserve(session, *items);
  if (!r.ok()) return r.status();
  for (const ReserveResult& res : *r) ToProto(res, resp->add_caches());
  return absl::OkStatus();
}

absl::Status Requests::Commit(S session, const v1::CommitRequest& req, v1::CommitResponse* resp) {
  absl::StatusOr<std::vector<CacheTokens>> items = DecodeItems("commit", req.items());
  if (!items.ok()) return items.status();
  absl::StatusOr<std::vector<CacheInfo>> r = store_->Commit(session, *items);
  if (!r.ok()) return r.status();
  for (const CacheInfo& info : *r) ToProto(info, resp->add_caches());
  return absl::OkStatus();
}

absl::Status Requests::GetKv(S session, const v1::GetKvRequest& req, v1::GetKvResponse* resp) {
  absl::StatusOr<int> layer = DecodeLayer("get_kv", req.layer());
  if (!layer.ok()) return layer.status();
  GetKvRange range;
  absl::StatusOr<int64_t> v = DecodeInt64("get_kv", "from_pos", req.from_pos());
  if (!v.ok()) return v.status();
  range.from_pos = *v;
  if (v = DecodeInt64("get_kv", "max_tokens", req.max_tokens()); !v.ok()) return v.status();
  range.max_tokens = *v;
  absl::StatusOr<GetKvResult> r = store_->GetKv(session, req.cache_id(), *layer, range);
  if (!r.ok()) return r.status();
  ToProto(std::move(r->k), resp->mutable_k());
  ToProto(std::move(r->v), resp->mutable_v());
  resp->set_first_pos(static_cast<uint64_t>(r->first_pos));
  resp->set_layer_len(static_cast<uint64_t>(r->layer_len));
  return absl::OkStatus();
}

absl::Status Requests::Describe(S session, const v1::DescribeRequest& req,
                                v1::DescribeResponse* resp) {
  absl::StatusOr<CacheDescription> d = store_->Describe(session, req.cache_id());
  if (!d.ok()) return d.status();
  ToProto(d->info, resp->mutable_cache());
  ToProto(d->layers, resp->mutable_layers());
  return absl::OkStatus();
}

absl::Status Requests::Stats(const v1::StatsRequest& req, v1::StatsResponse* resp) {
  if (req.cache_id().empty()) {
    ToProto(store_->Stats(), resp);
    return absl::OkStatus();
  }
  absl::StatusOr<PageStats> s = store_->CacheStats(req.cache_id());
  if (s.ok()) ToProto(*s, resp->mutable_pages());
  return s.status();
}

absl::Status Requests::ListCaches(const v1::ListCachesRequest& req, v1::ListCachesResponse* resp) {
  absl::StatusOr<std::string> after = DecodePageToken(req.page_token());
  if (!after.ok()) return after.status();
  const KvStore::CachePage page = store_->ListCaches(*after, DecodePageSize(req.page_size()));
  for (const CacheInfo& info : page.caches) ToProto(info, resp->add_caches());
  if (page.more) resp->set_next_page_token(EncodePageToken(page.last_id));
  return absl::OkStatus();
}

}  // namespace kvarena
