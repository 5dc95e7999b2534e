#include "core/kv_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/checked.h"
#include "base/status_macros.h"
#include "core/refusal.h"
#include "core/validate.h"

namespace kvarena {
namespace {

int64_t SlidingLayers(const CacheSpec& spec) {
  return std::count_if(spec.layer_windows.begin(), spec.layer_windows.end(),
                       [](int w) { return w > 0; });
}

// The exact identity of a namespace and geometry, for the index's roots.
std::string RootKey(const CacheSpec& s) {
  if (s.prefix_namespace.empty()) return "";
  return absl::StrCat(s.prefix_namespace.size(), ":", s.prefix_namespace, "/", int(s.dtype), "/",
                      int(s.kv_format), "/", s.page_size, "/", s.num_kv_heads, "/", s.head_dim, "/",
                      s.num_layers, "/", StaticScalesDigest(s), "/",
                      absl::StrJoin(s.layer_windows, ","));
}

}  // namespace

size_t KvCache::FixedMetadataBytes(const CacheSpec& spec, const std::string& id) {
  // The cache's map entries (the store's and its session's) at a hash map's lowest load.
  constexpr size_t kMapEntries = 2 * 3 * 64;
  const size_t per_layer =
      sizeof(LayerTable) + sizeof(int64_t) + sizeof(int);  // table, prefix_.reg_next, window
  return sizeof(KvCache) + kMapEntries + 3 * id.size() + 2 * spec.prefix_namespace.size() + 64 +
         size_t(spec.num_layers) * per_layer +
         sizeof(float) * (spec.k_scales.size() + spec.v_scales.size());
}

KvCache::KvCache(std::string id, CacheSpec spec, std::string owner, CacheContext ctx,
                 absl::Time now, BudgetCharge metadata)
    : id_(std::move(id)),
      spec_(std::move(spec)),
      owner_(std::move(owner)),
      ctx_(std::move(ctx)),
      fixed_metadata_(metadata.bytes()),
      last_used_(absl::ToUnixNanos(now)),
      layers_(size_t(spec_.num_layers)),
      metadata_(std::move(metadata)),
      prefix_(RootKey(spec_), sharing() ? PrefixRootHash(spec_.prefix_namespace, spec_) : Hash128{},
              spec_.num_layers) {
  ctx_.counters->layers_total += spec_.num_layers;
  ctx_.counters->layers_sliding += SlidingLayers(spec_);
}

KvCache::~KvCache() {
  // Release allocates (a list of the pages to return, index bookkeeping); should that
  // fail, the pages stay held rather than the daemon aborting in a destructor.
  try {
    Release();
  } catch (...) {
  }
  ctx_.quota->RemoveCache();
  ctx_.counters->layers_total -= spec_.num_layers;
  ctx_.counters->layers_sliding -= SlidingLayers(spec_);
}

absl::Status KvCache::CheckLiveLocked() const {
  if (released_) return absl::NotFoundError(absl::StrCat("cache ", Quoted(id_), " was released"));
  return absl::OkStatus();
}

absl::Status KvCache::CheckLayerLocked(absl::string_view op, int layer) const {
  KVARENA_RETURN_IF_ERROR(CheckLiveLocked());
  if (layer < 0 || layer >= spec_.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": layer=", layer, " but the cache has num_layers=", spec_.num_layers));
  }
  return absl::OkStatus();
}

int64_t KvCache::SeqLenLocked() const {
  int64_t seq = 0;
  for (const LayerTable& t : layers_) seq = std::max(seq, t.len());
  return seq;
}

int64_t KvCache::MaterializedLocked() const {
  return std::count_if(layers_.begin(), layers_.end(),
                       [](const LayerTable& t) { return t.num_blocks() > 0; });
}

void KvCache::PublishLocked(int64_t old_seq, int64_t old_mat) {
  ctx_.counters->seq_len_sum += SeqLenLocked() - old_seq;
  ctx_.counters->layers_materialized += MaterializedLocked() - old_mat;
}

absl::Status KvCache::TakePagesLocked(absl::string_view op, int layer, Taken* taken,
                                      std::vector<int32_t>* ids) {
  const int64_t n = taken->blocks;
  if (n <= 0) return absl::OkStatus();
  Quota& quota = *ctx_.quota;
  if (!quota.TryChargePages(n)) {
    return RefusedError(
        quota.PagesRefusal(n),
        absl::StrCat(op, ": layer ", layer, " needs ", n, " page(s) but ", quota.DescribePages(n)));
  }
  if (absl::Status s = AllocateLocked(n, ids, &taken->chunks); !s.ok()) {
    quota.RefundPages(n);
    return Annotated(s, absl::StrCat(op, ": layer ", layer, ": "));
  }
  pages_held_ += n;
  return absl::OkStatus();
}

absl::Status KvCache::AllocateLocked(int64_t n, std::vector<int32_t>* ids,
                                     std::vector<int32_t>* chunks) {
  return ctx_.allocate ? ctx_.allocate(ctx_.pool.get(), n, ids, chunks)
                       : ctx_.pool->Allocate(n, ids, chunks);
}

std::vector<int32_t> KvCache::TailFirstLocked() const {
  int64_t last = 0;
  for (const LayerTable& t : layers_) last = std::max(last, t.first_block() + t.num_blocks());
  std::vector<int32_t> ids;
  for (int64_t b = last - 1; b >= 0; --b) {
    for (const LayerTable& t : layers_) {
      if (b >= t.first_block() && b < t.first_block() + t.num_blocks()) ids.push_back(t.block(b));
    }
  }
  return ids;
}

void KvCache::ReturnPagesLocked(std::vector<int32_t>& ids) {
  if (ids.empty()) return;
  ctx_.pool->Free(ids);
  ctx_.quota->RefundPages(int64_t(ids.size()));
  pages_held_ -= int64_t(ids.size());
  ids.clear();
}

PagedKvView KvCache::ViewLocked(int layer) const {
  PagedKvView v = layers_[size_t(layer)].View(ctx_.pool->layout(), ctx_.pool->base());
  SetStaticScales(spec_, layer, &v);
  return v;
}

void KvCache::EvictLocked(int layer, int64_t block_start) {
  const int w = spec_.layer_windows[size_t(layer)];
  if (w == 0) return;
  // The next query is at block_start or later and sees keys in (p - w, p].
  std::vector<int32_t> freed;
  layers_[size_t(layer)].EvictBelow(block_start - w + 1, spec_.page_size, &freed);
  if (freed.empty()) return;
  std::reverse(freed.begin(), freed.end());  // a chain's tail first: its head stays cached longest
  pages_evicted_ += freed.size();
  ctx_.counters->pages_evicted += freed.size();
  ReturnPagesLocked(freed);
}

absl::StatusOr<KvCache::Taken> KvCache::AppendLocked(absl::string_view op, int layer, int64_t pos,
                                                     const TensorArg& k, const TensorArg& v) {
  LayerTable& t = layers_[size_t(layer)];
  if (pos != t.len()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": pos=", pos, " but layer ", layer, " holds ", t.len(), " tokens"));
  }
  absl::StatusOr<int64_t> nk =
      CheckTensor(op, "k", k, spec_.dtype, spec_.num_kv_heads, spec_.head_dim, limits());
  KVARENA_RETURN_IF_ERROR(nk.status());
  absl::StatusOr<int64_t> nv =
      CheckTensor(op, "v", v, spec_.dtype, spec_.num_kv_heads, spec_.head_dim, limits());
  KVARENA_RETURN_IF_ERROR(nv.status());
  if (*nk != *nv) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": k has ", *nk, " tokens but v has ", *nv));
  }
  const int64_t n = *nk;
  KVARENA_RETURN_IF_ERROR(
      CheckGrowth(op, absl::StrCat("layer ", layer, " length"), pos, n, limits()));
  if (spec_.max_tokens > 0 && n > spec_.max_tokens - pos) {
    CountRefusal();
    return RefusedError(Refusal::kMaxTokens,
                        absl::StrCat(op, ": layer ", layer, " would hold ", pos + n,
                                     " tokens but max_tokens=", spec_.max_tokens));
  }
  Taken taken;
  taken.blocks = t.BlocksMissing(pos + n, spec_.page_size);
  std::vector<int32_t> ids;
  if (absl::Status s = TakePagesLocked(op, layer, &taken, &ids); !s.ok()) {
    CountRefusal();
    return s;
  }
  // The new blocks start at or after pos, so the tokens fill all of them but the tail of
  // the last: clear that one before anything can read it.
  absl::Status written = taken.blocks > 0 ? kernels().ClearPages(ctx_.pool->layout(),
                                                                 ctx_.pool->base(), &ids.back(), 1)
                                          : absl::OkStatus();
  t.AddBlocks(ids.data(), int64_t(ids.size()));
  if (written.ok()) written = kernels().AppendKv(ViewLocked(layer), pos, n, k.data, v.data);
  if (!written.ok()) {  // a device error: give back what this call took
    UndoAppendLocked(layer, pos, taken);
    return absl::InternalError(absl::StrCat(op, ": layer ", layer, ": ", written.message()));
  }
  t.set_len(pos + n);
  return taken;
}

void KvCache::UndoAppendLocked(int layer, int64_t old_len, const Taken& taken) {
  LayerTable& t = layers_[size_t(layer)];
  std::vector<int32_t> added;
  t.DropLastBlocks(taken.blocks, &added);
  t.set_len(old_len);
  ctx_.pool->Unallocate(added, taken.chunks);
  ctx_.quota->RefundPages(int64_t(added.size()));
  pages_held_ -= int64_t(added.size());
}

absl::StatusOr<AppendResult> KvCache::Append(int layer, int64_t pos, const TensorArg& k,
                                             const TensorArg& v) {
  absl::MutexLock lock(&mu_);
  KVARENA_RETURN_IF_ERROR(CheckLayerLocked("append", layer));
  const int64_t old_seq = SeqLenLocked();
  const int64_t old_mat = MaterializedLocked();
  KVARENA_ASSIGN_OR_RETURN(Taken added, AppendLocked("append", layer, pos, k, v));
  RegisterLocked(layer);
  EvictLocked(layer, pos);
  PublishLocked(old_seq, old_mat);
  return AppendResult{layers_[size_t(layer)].len(), SeqLenLocked()};
}

absl::StatusOr<PopnResult> KvCache::Popn(uint64_t n) {
  absl::MutexLock lock(&mu_);
  KVARENA_RETURN_IF_ERROR(CheckLiveLocked());
  const int64_t seq = SeqLenLocked();
  PopnResult r{0, seq, ""};
  if (n == 0) return r;
  if (n > uint64_t(seq)) {
    r.refusal = absl::StrCat("popn: n=", n, " but seq_len=", seq);
    CountRefusal();
    return r;
  }
  const int64_t end = seq - int64_t(n);
  for (int i = 0; i < spec_.num_layers; ++i) {
    const LayerTable& t = layers_[size_t(i)];
    const int w = spec_.layer_windows[size_t(i)];
    if (w == 0 || t.len() <= end) continue;
    const int64_t need = std::max<int64_t>(0, end - w + 1);
    if (t.first_pos(spec_.page_size) > need) {
      r.refusal = absl::StrCat("popn: n=", n, " needs layer ", i, " to hold position ", need,
                               " but its window (", w, ") evicted everything below ",
                               t.first_pos(spec_.page_size));
      CountRefusal();
      return r;
    }
  }
  if (absl::Status s = CopyKeptPagesLocked(end); !s.ok()) {
    if (absl::IsResourceExhausted(s)) CountRefusal();
    return s;
  }
  const int64_t old_mat = MaterializedLocked();
  std::vector<int32_t> freed;
  for (LayerTable& t : layers_) {
    std::vector<int32_t> layer_freed;
    if (t.len() > end) t.Truncate(end, spec_.page_size, &layer_freed);
    freed.insert(freed.end(), layer_freed.rbegin(), layer_freed.rend());
  }
  ReturnPagesLocked(freed);
  ForgetTokensLocked(end);
  prefix_.cached_tokens = std::min(prefix_.cached_tokens, end);
  PublishLocked(seq, old_mat);
  r.popped = int64_t(n);
  r.seq_len = SeqLenLocked();
  return r;
}

absl::StatusOr<CacheInfo> KvCache::Reset(bool keep_pages) {
  absl::MutexLock lock(&mu_);
  KVARENA_RETURN_IF_ERROR(CheckLiveLocked());
  const int64_t old_seq = SeqLenLocked();
  const int64_t old_mat = MaterializedLocked();
  std::vector<int32_t> freed;
  if (keep_pages) {
    // Each layer keeps, for positions from 0 on, the pages it may write again; shared and
    // registered pages go (they stay cached for others).
    for (LayerTable& t : layers_) {
      std::vector<int32_t> all, kept;
      t.Clear(/*keep_pages=*/false, &all);
      for (auto it = all.rbegin(); it != all.rend(); ++it) {
        (ctx_.pool->Writable(*it) ? kept : freed).push_back(*it);
      }
      std::reverse(kept.begin(), kept.end());
      t.AddBlocks(kept.data(), int64_t(kept.size()));
    }
  } else {
    freed = TailFirstLocked();
    for (LayerTable& t : layers_) {
      std::vector<int32_t> dropped;
      t.Clear(/*keep_pages=*/false, &dropped);
    }
  }
  ReturnPagesLocked(freed);
  ForgetTokensLocked(0);
  prefix_.cached_tokens = 0;
  PublishLocked(old_seq, old_mat);
  return InfoLocked();
}

void KvCache::Release() {
  absl::MutexLock lock(&mu_);
  if (released_) return;
  const int64_t old_seq = SeqLenLocked();
  const int64_t old_mat = MaterializedLocked();
  std::vector<int32_t> freed = TailFirstLocked();
  for (LayerTable& t : layers_) {
    std::vector<int32_t> dropped;
    t.Clear(/*keep_pages=*/false, &dropped);
  }
  ReturnPagesLocked(freed);
  ForgetTokensLocked(0);
  PublishLocked(old_seq, old_mat);
  released_ = true;
}

CacheInfo KvCache::InfoLocked() const {
  CacheInfo info;
  info.cache_id = id_;
  info.spec = spec_;
  info.seq_len = SeqLenLocked();
  info.layer_lens.reserve(layers_.size());
  info.layer_first_pos.reserve(layers_.size());
  for (const LayerTable& t : layers_) {
    info.layer_lens.push_back(t.len());
    info.layer_first_pos.push_back(t.first_pos(spec_.page_size));
  }
  info.pool_id = ctx_.pool->id();
  info.page_bytes = ctx_.pool->page_bytes();
  info.cached_tokens = prefix_.cached_tokens;
  info.tier_loaded_tokens =
      prefix_.tier_from < 0 ? 0 : std::max<int64_t>(0, prefix_.cached_tokens - prefix_.tier_from);
  info.tokens_known = int64_t(prefix_.tokens.size());
  return info;
}

absl::StatusOr<CacheInfo> KvCache::Info() {
  absl::MutexLock lock(&mu_);
  KVARENA_RETURN_IF_ERROR(CheckLiveLocked());
  return InfoLocked();
}

absl::StatusOr<PageStats> KvCache::Stats() {
  const PoolStats pool = ctx_.pool->Stats();
  absl::MutexLock lock(&mu_);
  KVARENA_RETURN_IF_ERROR(CheckLiveLocked());
  PageStats st;
  st.pages_used = pages_held_;
  st.pages_free = pool.pages_free;
  st.num_pages = st.pages_used + st.pages_free;
  st.page_size = spec_.page_size;
  st.seq_len = SeqLenLocked();
  st.layers_materialized = MaterializedLocked();
  st.layers_total = spec_.num_layers;
  st.layers_sliding = SlidingLayers(spec_);
  st.bytes_used = uint64_t(pages_held_) * ctx_.pool->page_bytes();
  st.pages_evicted = pages_evicted_;
  st.refusals = refusals_.load(std::memory_order_relaxed);
  st.prefix_lookups = prefix_.requested > 0 ? 1 : 0;
  st.prefix_requested_tokens = prefix_.requested;
  st.prefix_hit_tokens = prefix_.hit;
  st.cow_copies = prefix_.cow_copies;
  return st;
}

}  // namespace kvarena
