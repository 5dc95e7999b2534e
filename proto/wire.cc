#include "proto/wire.h"

#include <type_traits>
#include <utility>

// One field of `s` from / into the message field of the same name, cast to the receiving
// side's type (the *_FIELDS lists in kvarena/types.h).
#define KVARENA_FIELD_FROM_PROTO(f) s.f = static_cast<decltype(s.f)>(p.f());
#define KVARENA_FIELD_TO_PROTO(f) p->set_##f(static_cast<std::decay_t<decltype(p->f())>>(s.f));

namespace kvarena {

// The enums share their numbering with the wire's (kvarena/paged_kv.h); a wire value
// outside the tables decodes to kUnspecified, so core rejects it by name.
DType FromProto(v1::DType d) {
  return FindDType(DType(d)) != nullptr ? DType(d) : DType::kUnspecified;
}
v1::DType ToProto(DType d) { return v1::DType(FindDType(d) != nullptr ? int(d) : 0); }
KvFormat FromProto(v1::KvFormat f) {
  return FindKvFormat(KvFormat(f)) != nullptr ? KvFormat(f) : KvFormat::kUnspecified;
}
v1::KvFormat ToProto(KvFormat f) { return v1::KvFormat(FindKvFormat(f) != nullptr ? int(f) : 0); }

CacheSpec FromProto(const v1::CacheSpec& p) {
  CacheSpec s;
  s.num_layers = static_cast<int>(p.num_layers());
  s.num_kv_heads = static_cast<int>(p.num_kv_heads());
  s.head_dim = static_cast<int>(p.head_dim());
  s.dtype = FromProto(p.dtype());
  s.page_size = static_cast<int>(p.page_size());
  s.layer_windows.assign(p.layer_windows().begin(), p.layer_windows().end());
  s.max_tokens = static_cast<int64_t>(p.max_tokens());
  s.prefix_namespace = p.prefix_namespace();
  s.kv_format = FromProto(p.kv_format());
  s.k_scales.assign(p.k_scales().begin(), p.k_scales().end());
  s.v_scales.assign(p.v_scales().begin(), p.v_scales().end());
  return s;
}

void ToProto(const CacheSpec& s, v1::CacheSpec* p) {
  p->set_num_layers(static_cast<uint32_t>(s.num_layers));
  p->set_num_kv_heads(static_cast<uint32_t>(s.num_kv_heads));
  p->set_head_dim(static_cast<uint32_t>(s.head_dim));
  p->set_dtype(ToProto(s.dtype));
  p->set_page_size(static_cast<uint32_t>(s.page_size));
  p->mutable_layer_windows()->Assign(s.layer_windows.begin(), s.layer_windows.end());
  p->set_max_tokens(static_cast<uint64_t>(s.max_tokens));
  p->set_prefix_namespace(s.prefix_namespace);
  p->set_kv_format(ToProto(s.kv_format));
  p->mutable_k_scales()->Assign(s.k_scales.begin(), s.k_scales.end());
  p->mutable_v_scales()->Assign(s.v_scales.begin(), s.v_scales.end());
}

CacheInfo FromProto(const v1::CacheInfo& p) {
  CacheInfo c;
  c.cache_id = p.cache_id();
  c.spec = FromProto(p.spec());
  c.seq_len = static_cast<int64_t>(p.seq_len());
  c.layer_lens.assign(p.layer_lens().begin(), p.layer_lens().end());
  c.layer_first_pos.assign(p.layer_first_pos().begin(), p.layer_first_pos().end());
  c.pool_id = p.pool_id();
  c.page_bytes = p.page_bytes();
  c.cached_tokens = static_cast<int64_t>(p.cached_tokens());
  c.tokens_known = static_cast<int64_t>(p.tokens_known());
  c.tier_loaded_tokens = static_cast<int64_t>(p.tier_loaded_tokens());
  return c;
}

void ToProto(const CacheInfo& c, v1::CacheInfo* p) {
  p->set_cache_id(c.cache_id);
  ToProto(c.spec, p->mutable_spec());
  p->set_seq_len(static_cast<uint64_t>(c.seq_len));
  p->mutable_layer_lens()->Assign(c.layer_lens.begin(), c.layer_lens.end());
  p->mutable_layer_first_pos()->Assign(c.layer_first_pos.begin(), c.layer_first_pos.end());
  p->set_pool_id(c.pool_id);
  p->set_page_bytes(c.page_bytes);
  p->set_cached_tokens(static_cast<uint64_t>(c.cached_tokens));
  p->set_tokens_known(static_cast<uint64_t>(c.tokens_known));
  p->set_tier_loaded_tokens(static_cast<uint64_t>(c.tier_loaded_tokens));
}

// A message without an inline payload decodes to data == nullptr, bytes == 0: "absent".
TensorArg FromProto(const v1::Tensor& p) {
  TensorArg t;
  t.dtype = FromProto(p.dtype());
  t.shape.assign(p.shape().begin(), p.shape().end());
  if (p.payload_case() == v1::Tensor::kData) {
    t.data = p.data().data();
    t.bytes = p.data().size();
  }
  return t;
}

void ToProto(const TensorArg& t, v1::Tensor* p) {
  p->mutable_shape()->Assign(t.shape.begin(), t.shape.end());
  p->set_dtype(ToProto(t.dtype));
  if (t.data != nullptr) {
    p->set_data(t.data, t.bytes);
  } else {
    p->clear_payload();
  }
}

void ToProto(TensorOut&& t, v1::Tensor* p) {
  p->mutable_shape()->Assign(t.shape.begin(), t.shape.end());
  p->set_dtype(ToProto(t.dtype));
  p->set_data(std::move(t.data));
}

TensorOut TensorOutFromProto(const v1::Tensor& p) {
  TensorOut t;
  t.dtype = FromProto(p.dtype());
  t.shape.assign(p.shape().begin(), p.shape().end());
  t.data = p.data();
  return t;
}

LayerPages FromProto(const v1::LayerPages& p) {
  LayerPages l;
  l.first_pos = static_cast<int64_t>(p.first_pos());
  l.len = static_cast<int64_t>(p.len());
  l.page_ids.assign(p.page_ids().begin(), p.page_ids().end());
  l.written = l.len;
  return l;
}

void ToProto(const LayerPages& l, uint32_t layer, v1::LayerPages* p) {
  p->set_layer(layer);
  p->set_first_pos(static_cast<uint64_t>(l.first_pos));
  p->set_len(static_cast<uint64_t>(l.len));
  p->mutable_page_ids()->Assign(l.page_ids.begin(), l.page_ids.end());
}

CacheTokens FromProto(const v1::CacheTokens& p) {
  return CacheTokens{p.cache_id(), static_cast<int64_t>(p.tokens())};
}

void ToProto(const CacheTokens& t, v1::CacheTokens* p) {
  p->set_cache_id(t.cache_id);
  p->set_tokens(t.tokens > 0 ? static_cast<uint64_t>(t.tokens) : 0);
}

ReserveResult FromProto(const v1::CacheReservation& p) {
  ReserveResult r;
  r.cache_id = p.cache_id();
  r.first_pos = static_cast<int64_t>(p.first_pos());
  r.layers.resize(static_cast<size_t>(p.layers_size()));
  for (const v1::LayerPages& l : p.layers()) {
    if (l.layer() < r.layers.size()) r.layers[l.layer()] = FromProto(l);
  }
  return r;
}

void ToProto(const ReserveResult& r, v1::CacheReservation* p) {
  p->set_cache_id(r.cache_id);
  p->set_first_pos(static_cast<uint64_t>(r.first_pos));
  p->clear_layers();
  for (size_t i = 0; i < r.layers.size(); ++i) {
    ToProto(r.layers[i], static_cast<uint32_t>(i), p->add_layers());
  }
}

void ToProto(const RegionInfo& r, v1::RegionDescriptor* p) {
  p->set_region_id(r.region_id);
  p->set_kind(r.kind);
  p->set_size(r.size);
  p->set_pool_id(r.pool_id);
  p->set_ipc_handle(r.ipc_handle);
  p->set_scratch(r.scratch);
}

RegionInfo FromProto(const v1::RegionDescriptor& p) {
  RegionInfo r;
  r.region_id = p.region_id();
  r.kind = p.kind();
  r.size = p.size();
  r.pool_id = p.pool_id();
  r.ipc_handle = p.ipc_handle();
  r.scratch = p.scratch();
  return r;
}

PageStats FromProto(const v1::PageStats& p) {
  PageStats s;
  KVARENA_PAGE_STATS_FIELDS(KVARENA_FIELD_FROM_PROTO)
  return s;
}

void ToProto(const PageStats& s,
             v1::PageStats* p){KVARENA_PAGE_STATS_FIELDS(KVARENA_FIELD_TO_PROTO)}

PoolStats FromProto(const v1::PoolStats& p) {
  PoolStats s;
  KVARENA_POOL_STATS_FIELDS(KVARENA_FIELD_FROM_PROTO)
  s.layout.num_kv_heads = static_cast<int>(p.num_kv_heads());
  s.layout.head_dim = static_cast<int>(p.head_dim());
  s.layout.dtype = FromProto(p.dtype());
  s.layout.page_size = static_cast<int>(p.page_size());
  s.layout.kv_format = FromProto(p.kv_format());
  s.owner = p.tenant();
  return s;
}

void ToProto(const PoolStats& s, v1::PoolStats* p) {
  KVARENA_POOL_STATS_FIELDS(KVARENA_FIELD_TO_PROTO)
  p->set_num_kv_heads(static_cast<uint32_t>(s.layout.num_kv_heads));
  p->set_head_dim(static_cast<uint32_t>(s.layout.head_dim));
  p->set_dtype(ToProto(s.layout.dtype));
  p->set_page_size(static_cast<uint32_t>(s.layout.page_size));
  p->set_kv_format(ToProto(s.layout.format()));
  p->set_tenant(s.owner);
}

std::string HashBytes(const Hash128& h) {
  std::string out(16, '\0');
  for (int i = 0; i < 8; ++i) {
    out[size_t(i)] = char(h.high >> (56 - 8 * i));
    out[size_t(8 + i)] = char(h.low >> (56 - 8 * i));
  }
  return out;
}

void ToProto(const PrefixEvent& e, v1::KvEvent* p) {
  p->set_seq(e.seq);
  p->set_pool_id(e.pool_id);
  switch (e.kind) {
    case PrefixEvent::Kind::kStored: {
      v1::KvEvent::BlockStored* s = p->mutable_stored();
      s->set_block_hash(HashBytes(e.hash));
      s->set_parent_hash(HashBytes(e.parent_hash));
      s->set_layer(static_cast<uint32_t>(e.layer));
      s->mutable_token_ids()->Assign(e.token_ids.begin(), e.token_ids.end());
      s->set_num_tokens(static_cast<uint32_t>(e.token_ids.size()));
      s->set_prefix_namespace(e.prefix_namespace);
      s->set_medium(e.medium);
      break;
    }
    case PrefixEvent::Kind::kRemoved:
      p->mutable_removed()->set_block_hash(HashBytes(e.hash));
      p->mutable_removed()->set_layer(static_cast<uint32_t>(e.layer));
      p->mutable_removed()->set_medium(e.medium);
      break;
    case PrefixEvent::Kind::kAllCleared:
      p->mutable_all_cleared();
      break;
  }
}

ArenaStats FromProto(const v1::StatsResponse& p) {
  ArenaStats s;
  KVARENA_ARENA_STATS_FIELDS(KVARENA_FIELD_FROM_PROTO)
  s.pages = FromProto(p.pages());
  for (const v1::PoolStats& pool : p.pools()) s.pools.push_back(FromProto(pool));
  for (const v1::TierStats& tier : p.tiers()) s.tiers.push_back(FromProto(tier));
  return s;
}

void ToProto(const ArenaStats& s, v1::StatsResponse* p) {
  KVARENA_ARENA_STATS_FIELDS(KVARENA_FIELD_TO_PROTO)
  ToProto(s.pages, p->mutable_pages());
  p->clear_pools();
  p->mutable_pools()->Reserve(static_cast<int>(s.pools.size()));
  for (const PoolStats& pool : s.pools) ToProto(pool, p->add_pools());
  p->clear_tiers();
  for (const TierStats& tier : s.tiers) ToProto(tier, p->add_tiers());
}

TierStats FromProto(const v1::TierStats& p) {
  TierStats s;
  KVARENA_TIER_STATS_FIELDS(KVARENA_FIELD_FROM_PROTO)
  return s;
}

void ToProto(const TierStats& s, v1::TierStats* p) {
  KVARENA_TIER_STATS_FIELDS(KVARENA_FIELD_TO_PROTO)
}

}  // namespace kvarena
