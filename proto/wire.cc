#include "proto/wire.h"

#include <utility>

namespace kvarena {

// The two enums share their numbering (kernels/paged_kv.h); an unknown wire value
// decodes to kUnspecified so core rejects it by name.
DType FromProto(v1::DType d) {
  switch (d) {
    case v1::FLOAT32: return DType::kFloat32;
    case v1::FLOAT16: return DType::kFloat16;
    case v1::BFLOAT16: return DType::kBFloat16;
    default: return DType::kUnspecified;
  }
}

v1::DType ToProto(DType d) {
  switch (d) {
    case DType::kFloat32: return v1::FLOAT32;
    case DType::kFloat16: return v1::FLOAT16;
    case DType::kBFloat16: return v1::BFLOAT16;
    case DType::kUnspecified: break;
  }
  return v1::DTYPE_UNSPECIFIED;
}

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
  s.num_pages = static_cast<int64_t>(p.num_pages());
  s.pages_used = static_cast<int64_t>(p.pages_used());
  s.pages_free = static_cast<int64_t>(p.pages_free());
  s.page_size = static_cast<int>(p.page_size());
  s.seq_len = static_cast<int64_t>(p.seq_len());
  s.layers_materialized = p.layers_materialized();
  s.layers_total = p.layers_total();
  s.layers_sliding = p.layers_sliding();
  s.bytes_used = p.bytes_used();
  s.pages_evicted = p.pages_evicted();
  s.refusals = p.refusals();
  s.pages_cached = static_cast<int64_t>(p.pages_cached());
  s.pages_shared = static_cast<int64_t>(p.pages_shared());
  s.pages_evicted_lru = p.pages_evicted_lru();
  s.prefix_lookups = p.prefix_lookups();
  s.prefix_requested_tokens = p.prefix_requested_tokens();
  s.prefix_hit_tokens = p.prefix_hit_tokens();
  s.forks = p.forks();
  s.cow_copies = p.cow_copies();
  return s;
}

void ToProto(const PageStats& s, v1::PageStats* p) {
  p->set_num_pages(static_cast<uint64_t>(s.num_pages));
  p->set_pages_used(static_cast<uint64_t>(s.pages_used));
  p->set_pages_free(static_cast<uint64_t>(s.pages_free));
  p->set_page_size(static_cast<uint32_t>(s.page_size));
  p->set_seq_len(static_cast<uint64_t>(s.seq_len));
  p->set_layers_materialized(static_cast<uint32_t>(s.layers_materialized));
  p->set_layers_total(static_cast<uint32_t>(s.layers_total));
  p->set_layers_sliding(static_cast<uint32_t>(s.layers_sliding));
  p->set_bytes_used(s.bytes_used);
  p->set_pages_evicted(s.pages_evicted);
  p->set_refusals(s.refusals);
  p->set_pages_cached(static_cast<uint64_t>(s.pages_cached));
  p->set_pages_shared(static_cast<uint64_t>(s.pages_shared));
  p->set_pages_evicted_lru(s.pages_evicted_lru);
  p->set_prefix_lookups(s.prefix_lookups);
  p->set_prefix_requested_tokens(s.prefix_requested_tokens);
  p->set_prefix_hit_tokens(s.prefix_hit_tokens);
  p->set_forks(s.forks);
  p->set_cow_copies(s.cow_copies);
}

PoolStats FromProto(const v1::PoolStats& p) {
  PoolStats s;
  s.pool_id = p.pool_id();
  s.layout.num_kv_heads = static_cast<int>(p.num_kv_heads());
  s.layout.head_dim = static_cast<int>(p.head_dim());
  s.layout.dtype = FromProto(p.dtype());
  s.layout.page_size = static_cast<int>(p.page_size());
  s.page_bytes = p.page_bytes();
  s.num_pages = static_cast<int64_t>(p.num_pages());
  s.pages_used = static_cast<int64_t>(p.pages_used());
  s.pages_free = static_cast<int64_t>(p.pages_free());
  s.chunks_committed = static_cast<int64_t>(p.chunks_committed());
  s.chunk_bytes = p.chunk_bytes();
  s.bytes_committed = p.bytes_committed();
  s.num_caches = static_cast<int64_t>(p.num_caches());
  s.pages_cached = static_cast<int64_t>(p.pages_cached());
  s.pages_shared = static_cast<int64_t>(p.pages_shared());
  s.owner = p.tenant();
  return s;
}

void ToProto(const PoolStats& s, v1::PoolStats* p) {
  p->set_pool_id(s.pool_id);
  p->set_num_kv_heads(static_cast<uint32_t>(s.layout.num_kv_heads));
  p->set_head_dim(static_cast<uint32_t>(s.layout.head_dim));
  p->set_dtype(ToProto(s.layout.dtype));
  p->set_page_size(static_cast<uint32_t>(s.layout.page_size));
  p->set_page_bytes(s.page_bytes);
  p->set_num_pages(static_cast<uint64_t>(s.num_pages));
  p->set_pages_used(static_cast<uint64_t>(s.pages_used));
  p->set_pages_free(static_cast<uint64_t>(s.pages_free));
  p->set_chunks_committed(static_cast<uint64_t>(s.chunks_committed));
  p->set_chunk_bytes(s.chunk_bytes);
  p->set_bytes_committed(s.bytes_committed);
  p->set_num_caches(static_cast<uint64_t>(s.num_caches));
  p->set_pages_cached(static_cast<uint64_t>(s.pages_cached));
  p->set_pages_shared(static_cast<uint64_t>(s.pages_shared));
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
  s.pages = FromProto(p.pages());
  for (const v1::PoolStats& pool : p.pools()) s.pools.push_back(FromProto(pool));
  s.backend = p.backend();
  s.arena_bytes = p.arena_bytes();
  s.bytes_committed = p.bytes_committed();
  s.bytes_used = p.bytes_used();
  s.num_caches = static_cast<int64_t>(p.num_caches());
  s.num_sessions = static_cast<int64_t>(p.num_sessions());
  s.scratch_bytes = p.scratch_bytes();
  s.scratch_regions = static_cast<int64_t>(p.scratch_regions());
  s.metadata_bytes = p.metadata_bytes();
  s.metadata_bytes_used = p.metadata_bytes_used();
  s.event_log_bytes = p.event_log_bytes();
  for (const v1::TierStats& t : p.tiers()) {
    TierStats& o = s.tiers.emplace_back();
    o.medium = t.medium();
    o.bytes_used = t.bytes_used();
    o.bytes_limit = t.bytes_limit();
    o.chunks = static_cast<int64_t>(t.chunks());
    o.up = t.up();
    o.lookups = t.lookups();
    o.hit_chunks = t.hit_chunks();
    o.miss_chunks = t.miss_chunks();
    o.loaded_tokens = t.loaded_tokens();
    o.stored_chunks = t.stored_chunks();
    o.dropped_writes = t.dropped_writes();
    o.corrupt_chunks = t.corrupt_chunks();
    o.errors = t.errors();
  }
  return s;
}

void ToProto(const ArenaStats& s, v1::StatsResponse* p) {
  ToProto(s.pages, p->mutable_pages());
  p->clear_pools();
  p->mutable_pools()->Reserve(static_cast<int>(s.pools.size()));
  for (const PoolStats& pool : s.pools) ToProto(pool, p->add_pools());
  p->set_backend(s.backend);
  p->set_arena_bytes(s.arena_bytes);
  p->set_bytes_committed(s.bytes_committed);
  p->set_bytes_used(s.bytes_used);
  p->set_num_caches(static_cast<uint64_t>(s.num_caches));
  p->set_num_sessions(static_cast<uint64_t>(s.num_sessions));
  p->set_scratch_bytes(s.scratch_bytes);
  p->set_scratch_regions(static_cast<uint64_t>(s.scratch_regions));
  p->set_metadata_bytes(s.metadata_bytes);
  p->set_metadata_bytes_used(s.metadata_bytes_used);
  p->set_event_log_bytes(s.event_log_bytes);
  p->clear_tiers();
  for (const TierStats& t : s.tiers) {
    v1::TierStats* o = p->add_tiers();
    o->set_medium(t.medium);
    o->set_bytes_used(t.bytes_used);
    o->set_bytes_limit(t.bytes_limit);
    o->set_chunks(static_cast<uint64_t>(t.chunks));
    o->set_up(t.up);
    o->set_lookups(t.lookups);
    o->set_hit_chunks(t.hit_chunks);
    o->set_miss_chunks(t.miss_chunks);
    o->set_loaded_tokens(t.loaded_tokens);
    o->set_stored_chunks(t.stored_chunks);
    o->set_dropped_writes(t.dropped_writes);
    o->set_corrupt_chunks(t.corrupt_chunks);
    o->set_errors(t.errors);
  }
}

}  // namespace kvarena
