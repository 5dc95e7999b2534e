// Value types of the API: cache specs, tensors passed in and out, results and stats.
// Plain structs with no synchronisation; the daemon and the client's inproc mode convert
// them to and from the wire (proto/kvarena/v1/kvarena.proto) field by field. Part of the
// client's public headers (client/include/kvarena/, which need nothing outside it but the
// standard library and abseil); core/ uses them through core/types.h.
#ifndef KVARENA_CLIENT_INCLUDE_KVARENA_TYPES_H_
#define KVARENA_CLIENT_INCLUDE_KVARENA_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvarena/paged_kv.h"

namespace kvarena {

// Every member has its default written out, so a caller's aggregate that names the first
// few (CacheSpec{layers, heads, dim, dtype, page_size}) leaves the rest at theirs without a
// -Wmissing-field-initializers warning, whatever members are added later.
struct CacheSpec {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  DType dtype = DType::kUnspecified;
  int page_size = 0;                    // 0: the store's default
  std::vector<int> layer_windows = {};  // empty, or one per layer; 0 = global, w >= 2 = sliding
  int64_t max_tokens = 0;               // 0: no limit beyond the arena
  // What must match for K/V to be interchangeable (model, adapter, tenant salt): full
  // pages are shared only between caches of one namespace and one geometry. "" shares
  // nothing (docs/prefix-reuse.md).
  std::string prefix_namespace = {};
  // How pages store K and V (kvarena/paged_kv.h's table); kUnspecified: as dtype. Part
  // of what pages are shared by, like the geometry. Allocate resolves it in CacheInfo.
  KvFormat kv_format = KvFormat::kUnspecified;
  // A format with static scales (fp8_e4m3): K's and V's, [num_layers][num_kv_heads] each,
  // finite and > 0; a page stores x / scale. Empty: every scale is 1 (Allocate fills them
  // in CacheInfo). Part of the prefix identity, like the format.
  std::vector<float> k_scales = {};
  std::vector<float> v_scales = {};
};

// The pages a spec's caches use: its geometry, activation dtype and KV format.
inline PageLayout LayoutOf(const CacheSpec& s) {
  return PageLayout{s.dtype, s.page_size, s.num_kv_heads, s.head_dim, s.kv_format};
}

// Points v at layer's static scales in s (PagedKvView::k_scales), or at none when s has
// none (resolved scales hold [num_layers][num_kv_heads] or nothing).
inline void SetStaticScales(const CacheSpec& s, int layer, PagedKvView* v) {
  const size_t end = (size_t(layer) + 1) * size_t(s.num_kv_heads);
  const size_t at = end - size_t(s.num_kv_heads);
  v->k_scales = s.k_scales.size() >= end ? s.k_scales.data() + at : nullptr;
  v->v_scales = s.v_scales.size() >= end ? s.v_scales.data() + at : nullptr;
}

struct CacheInfo {
  std::string cache_id;
  CacheSpec spec;  // page_size resolved, layer_windows filled to num_layers
  int64_t seq_len = 0;
  std::vector<int64_t> layer_lens;
  // Per layer: absolute position of the first token still held (0 unless a sliding
  // window evicted a prefix). Equals GetKv's first_pos and Describe's layers[i].first_pos.
  std::vector<int64_t> layer_first_pos;
  uint64_t pool_id = 0;
  uint64_t page_bytes = 0;
  // Leading positions filled from other caches' pages rather than by this cache's writes:
  // the prefix adopted at Allocate (a fork: every position of its source); popn and reset
  // lower it with seq_len.
  int64_t cached_tokens = 0;
  // Of cached_tokens, those loaded from the tiers below the arena (docs/tiers.md) rather
  // than adopted from pages still in it.
  int64_t tier_loaded_tokens = 0;
  // Leading positions whose token ids are known (prompt_tokens, SetTokens).
  int64_t tokens_known = 0;
};

// Allocate's optional prompt: its token ids (>= 0) are the cache's first positions; with
// a prefix namespace the longest cached prefix of them is adopted (CacheInfo.cached_tokens).
struct AllocateOptions {
  std::vector<int32_t> prompt_tokens;
};

// SetTokens: token ids of positions [first_pos, first_pos + token_ids.size()).
struct SetTokensArgs {
  std::string cache_id;
  int64_t first_pos = 0;
  std::vector<int32_t> token_ids;
};

// A borrowed, contiguous, row-major tensor: [1, heads, tokens, head_dim] at the API.
struct TensorArg {
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

// A tensor the core returns (GetKv); data holds the raw bytes.
struct TensorOut {
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
  std::string data;
};

struct AppendResult {
  int64_t layer_len = 0;
  int64_t seq_len = 0;
};

struct AttendArgs {
  std::string cache_id;
  int layer = 0;
  int64_t pos = 0;
  TensorArg q;
  TensorArg k;  // k and v both absent (data == nullptr, bytes == 0): attend over the cache
  TensorArg v;
  double scale = 0;     // 0: 1/sqrt(head_dim)
  uint32_t window = 0;  // 0: the layer's own window; else also mask keys older than this
};

struct AttendResult {
  std::vector<int64_t> out_shape;  // equals q's shape; out has q's dtype
  int64_t seq_len = 0;
};

struct PopnResult {
  int64_t popped = 0;  // n, or 0 when refused
  int64_t seq_len = 0;
  std::string refusal;  // why it refused; empty when popped == n
};

// A range of one layer for GetKv: positions [max(from_pos, first held), ...), at most
// max_tokens of them (0: to the end of the layer). raw: a quantized cache's codes and
// scales as its pages store them (GetKvResult), not values in the activation dtype.
struct GetKvRange {
  int64_t from_pos = 0;
  int64_t max_tokens = 0;
  bool raw = false;
};

struct GetKvResult {
  // [1, num_kv_heads, tokens, head_dim]: values in the activation dtype, or raw one code of
  // kv_format per element (dtype kUnspecified).
  TensorOut k;
  TensorOut v;
  int64_t first_pos = 0;  // absolute position of the first returned token
  int64_t layer_len = 0;  // the layer's length: the range ends at first_pos + tokens <= it
  // What k and v hold: the cache's KV format when raw, else the activation dtype's.
  KvFormat kv_format = KvFormat::kUnspecified;
  // Raw only, float32, value = code * scale. KvScales::kPerToken (int8): [1, num_kv_heads,
  // tokens]; kPerHead (fp8_e4m3): [num_kv_heads], the layer's static scales; else empty.
  TensorOut k_scales;
  TensorOut v_scales;
};

// One layer's block table, in the one shape every call gives it (Describe, Reserve,
// GenericKvCacheHandle::local_table): page_ids[i] holds absolute positions
// [first_pos + i * page_size, first_pos + (i + 1) * page_size), position t at slot
// t % page_size. A snapshot: it does not follow later calls.
//   Describe:    every page the layer holds, reserved ones included.
//   Reserve:     the pages covering what it reserved, from the page holding len.
//   local_table: what the handle knows without an RPC, its local writes included.
struct LayerPages {
  int64_t first_pos = 0;  // a multiple of page_size; a sliding window evicted what lies below
  int64_t len = 0;        // committed tokens (absolute)
  std::vector<int32_t> page_ids;
  // len + what append_local / attention_local wrote since the last commit (local_table);
  // Describe and Reserve, which see only the arena, give len.
  int64_t written = 0;

  // The first position with no page: [written, end) has pages and no K/V yet.
  int64_t end(int page_size) const { return first_pos + int64_t(page_ids.size()) * page_size; }
};

struct CacheDescription {
  CacheInfo info;
  std::vector<LayerPages> layers;
};

// Local path: make room for / commit `tokens` more tokens on every layer of a cache.
struct CacheTokens {
  std::string cache_id;
  int64_t tokens = 0;
};

struct ReserveResult {
  std::string cache_id;
  int64_t first_pos = 0;           // the first reserved position (the current seq_len)
  std::vector<LayerPages> layers;  // per layer: pages covering [first_pos, first_pos + tokens)
};

struct PageStats {
  int64_t num_pages = 0;  // pages_used + pages_free
  int64_t pages_used = 0;
  int64_t pages_free = 0;
  int page_size = 0;    // for the arena total: 0 unless every pool shares one page size
  int64_t seq_len = 0;  // for the arena total: sum over caches
  int64_t layers_materialized = 0;
  int64_t layers_total = 0;
  int64_t layers_sliding = 0;
  uint64_t bytes_used = 0;     // pages_used x page bytes
  uint64_t pages_evicted = 0;  // freed by sliding windows, since creation
  uint64_t refusals = 0;       // popn refusals and rejected appends / reserves, since creation
  // Prefix reuse. Arena: gauges now and counters since start. One cache: its own
  // prefix_* (its Allocate's lookup) and cow_copies; the pool-wide fields stay 0.
  int64_t pages_cached = 0;        // unreferenced registered pages, reclaimable (in pages_free)
  int64_t pages_shared = 0;        // pages referenced by two or more caches
  uint64_t pages_evicted_lru = 0;  // cached pages reclaimed for new allocations
  // Cached pages evicted to give metadata back (--cached_metadata_bytes, or a full
  // --metadata_bytes), since start.
  uint64_t pages_reclaimed_for_metadata = 0;
  uint64_t prefix_lookups = 0;           // Allocates with prompt_tokens and a namespace
  uint64_t prefix_requested_tokens = 0;  // their prompt lengths, summed
  uint64_t prefix_hit_tokens = 0;        // the cached_tokens they got, summed
  uint64_t forks = 0;
  uint64_t cow_copies = 0;  // pages copied because a popn cut into a shared page
};

struct PoolStats {
  uint64_t pool_id = 0;
  PageLayout layout;
  uint64_t page_bytes = 0;
  int64_t num_pages = 0;  // pages_used + pages_free
  int64_t pages_used = 0;
  int64_t pages_free = 0;    // free in committed chunks + what the uncommitted budget could give
                             // + pages_cached
  int64_t pages_cached = 0;  // unreferenced, still indexed for prefix reuse, reclaimable
  int64_t pages_shared = 0;  // referenced by two or more caches
  int64_t chunks_committed = 0;
  uint64_t chunk_bytes = 0;
  uint64_t bytes_committed = 0;
  int64_t num_caches = 0;
  std::string owner;  // the tenant whose caches draw from it (--tenants_file); "" without
};

// One tier below the arena (docs/tiers.md): what it holds now and its counts since the
// daemon started. Chunks are the tiers' unit (several pages of every layer).
struct TierStats {
  std::string medium;  // "host", "disk", "redis"
  uint64_t bytes_used = 0;
  uint64_t bytes_limit = 0;  // 0: none of its own (a cluster's maxmemory)
  int64_t chunks = 0;
  bool up = true;               // false while the medium cannot be reached
  uint64_t lookups = 0;         // chunks asked of it
  uint64_t hit_chunks = 0;      // found and verified
  uint64_t miss_chunks = 0;     // not held, unreadable or corrupt
  uint64_t loaded_tokens = 0;   // positions caches took from its chunks
  uint64_t stored_chunks = 0;   // written (a chunk it already held is not written again)
  uint64_t dropped_writes = 0;  // a full write queue, or a chunk it could not fit
  uint64_t corrupt_chunks = 0;  // read but failed verification (then dropped from it)
  uint64_t errors = 0;          // reads and writes that failed
};

// The statistics' fields that keep their name on the wire (kvarena.proto) and in the Python
// module's dicts, as X(name) each: the one list the conversions walk, so a field added to a
// struct and its message is added here once. Nested, renamed and repeated fields are
// converted by hand beside them.
// clang-format off
#define KVARENA_PAGE_STATS_FIELDS(X)                                              \
  X(num_pages) X(pages_used) X(pages_free) X(page_size) X(seq_len)              \
  X(layers_materialized) X(layers_total) X(layers_sliding) X(bytes_used)        \
  X(pages_evicted) X(refusals) X(pages_cached) X(pages_shared)                  \
  X(pages_evicted_lru) X(prefix_lookups) X(prefix_requested_tokens)             \
  X(prefix_hit_tokens) X(forks) X(cow_copies) X(pages_reclaimed_for_metadata)
#define KVARENA_POOL_STATS_FIELDS(X)                                              \
  X(pool_id) X(page_bytes) X(num_pages) X(pages_used) X(pages_free)             \
  X(chunks_committed) X(chunk_bytes) X(bytes_committed) X(num_caches)           \
  X(pages_cached) X(pages_shared)
#define KVARENA_TIER_STATS_FIELDS(X)                                              \
  X(medium) X(bytes_used) X(bytes_limit) X(chunks) X(up) X(lookups)             \
  X(hit_chunks) X(miss_chunks) X(loaded_tokens) X(stored_chunks)                \
  X(dropped_writes) X(corrupt_chunks) X(errors)
// ArenaStats' on the wire (the session counters are the daemon's metrics only).
#define KVARENA_ARENA_STATS_FIELDS(X)                                             \
  X(backend) X(arena_bytes) X(bytes_committed) X(bytes_used) X(num_caches)      \
  X(num_sessions) X(scratch_bytes) X(scratch_regions) X(metadata_bytes)         \
  X(metadata_bytes_used) X(event_log_bytes) X(cached_metadata_bytes)            \
  X(cached_metadata_limit)
// clang-format on

struct ArenaStats {
  PageStats pages;  // totals over every pool
  std::vector<PoolStats> pools;
  std::string backend;
  uint64_t arena_bytes = 0;
  uint64_t bytes_committed = 0;
  uint64_t bytes_used = 0;
  int64_t num_caches = 0;
  int64_t num_sessions = 0;
  uint64_t scratch_bytes = 0;  // charged to arena_bytes by live sessions' scratch regions
  int64_t scratch_regions = 0;
  uint64_t metadata_bytes = 0;  // --metadata_bytes: caches' tables, token ids, index nodes
  uint64_t metadata_bytes_used = 0;
  uint64_t event_log_bytes = 0;  // prefix-index events kept for WatchEvents
  // Of metadata_bytes_used, what prefixes no cache holds keep (cached for reuse), and
  // what they may keep (--cached_metadata_bytes).
  uint64_t cached_metadata_bytes = 0;
  uint64_t cached_metadata_limit = 0;
  // Sessions: of num_sessions, those detached and in their grace period; since creation,
  // those opened, detached, resumed (a new stream with the resume token) and reaped
  // (grace over: the session gone, its caches released).
  int64_t sessions_in_grace = 0;
  uint64_t sessions_opened = 0;
  uint64_t sessions_detached = 0;
  uint64_t sessions_resumed = 0;
  uint64_t sessions_reaped = 0;
  // Caches Reap released since creation: a reaped session's, and sessionless ones idle
  // past idle_ttl.
  uint64_t caches_reaped_grace = 0;
  uint64_t caches_reaped_idle = 0;
  // Of bytes_committed, the empty chunks pools keep warm (resident), and what they may
  // keep beyond one per pool (--arena_warm_bytes); whether the system backs the arena with
  // huge pages (host: shared-memory THP allows MADV_HUGEPAGE). The daemon's metrics only.
  uint64_t warm_bytes = 0;
  uint64_t warm_limit = 0;
  bool huge_pages = false;
  std::vector<TierStats> tiers;  // top (first looked up) to bottom; empty without tiers
};

}  // namespace kvarena

#endif  // KVARENA_CLIENT_INCLUDE_KVARENA_TYPES_H_
