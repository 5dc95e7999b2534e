#include "core/kv_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/validate.h"

namespace kvarena {

KvCache::KvCache(std::string id, CacheSpec spec, std::string owner, PagePool* pool,
                 KvKernels* kernels, StoreCounters* counters)
    : id_(std::move(id)), spec_(std::move(spec)), owner_(std::move(owner)), pool_(pool),
      kernels_(kernels), counters_(counters), layers_(size_t(spec_.num_layers)) {
  counters_->layers_total += spec_.num_layers;
  counters_->layers_sliding +=
      std::count_if(spec_.layer_windows.begin(), spec_.layer_windows.end(), [](int w) { return w > 0; });
}

KvCache::~KvCache() {
  Release();
  counters_->layers_total -= spec_.num_layers;
  counters_->layers_sliding -=
      std::count_if(spec_.layer_windows.begin(), spec_.layer_windows.end(), [](int w) { return w > 0; });
}

absl::Status KvCache::CheckLiveLocked() const {
  if (released_) return absl::NotFoundError(absl::StrCat("cache '", id_, "' was released"));
  return absl::OkStatus();
}

absl::Status KvCache::CheckLayerLocked(absl::string_view op, int layer) const {
  if (absl::Status s = CheckLiveLocked(); !s.ok()) return s;
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
  return std::count_if(layers_.begin(), layers_.end(), [](const LayerTable& t) { return t.num_blocks() > 0; });
}

void KvCache::PublishLocked(int64_t old_seq, int64_t old_mat) {
  counters_->seq_len_sum += SeqLenLocked() - old_seq;
  counters_->layers_materialized += MaterializedLocked() - old_mat;
}

void KvCache::FreeLocked(std::vector<int32_t>& ids, int64_t old_seq, int64_t old_mat) {
  if (!ids.empty()) pool_->Free(ids);
  pages_held_ -= int64_t(ids.size());
  ids.clear();
  PublishLocked(old_seq, old_mat);
}

PagedKvView KvCache::ViewLocked(int layer) const {
  return layers_[size_t(layer)].View(pool_->layout(), pool_->base());
}

void KvCache::EvictLocked(int layer, int64_t block_start) {
  const int w = spec_.layer_windows[size_t(layer)];
  if (w == 0) return;
  // The next query is at block_start or later and sees keys in (p - w, p].
  std::vector<int32_t> freed;
  layers_[size_t(layer)].EvictBelow(block_start - w + 1, spec_.page_size, &freed);
  if (freed.empty()) return;
  pool_->Free(freed);
  pages_held_ -= int64_t(freed.size());
  pages_evicted_ += freed.size();
  counters_->pages_evicted += freed.size();
}

absl::StatusOr<AppendResult> KvCache::AppendLocked(absl::string_view op, int layer, int64_t pos,
                                                   const TensorArg& k, const TensorArg& v) {
  LayerTable& t = layers_[size_t(layer)];
  if (pos != t.len()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": pos=", pos, " but layer ", layer, " holds ", t.len(), " tokens"));
  }
  absl::StatusOr<int64_t> nk = CheckTensor(op, "k", k, spec_.dtype, spec_.num_kv_heads, spec_.head_dim);
  if (!nk.ok()) return nk.status();
  absl::StatusOr<int64_t> nv = CheckTensor(op, "v", v, spec_.dtype, spec_.num_kv_heads, spec_.head_dim);
  if (!nv.ok()) return nv.status();
  if (*nk != *nv) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": k has ", *nk, " tokens but v has ", *nv));
  }
  const int64_t n = *nk;
  if (spec_.max_tokens > 0 && pos + n > spec_.max_tokens) {
    CountRefusal();
    return absl::ResourceExhaustedError(absl::StrCat(op, ": layer ", layer, " would hold ", pos + n,
                                                     " tokens but max_tokens=", spec_.max_tokens));
  }
  const int64_t old_seq = SeqLenLocked();
  const int64_t old_mat = MaterializedLocked();
  const int64_t missing = t.BlocksMissing(pos + n, spec_.page_size);
  if (missing > 0) {
    std::vector<int32_t> ids;
    if (absl::Status s = pool_->Allocate(missing, &ids); !s.ok()) {
      CountRefusal();
      return absl::Status(s.code(), absl::StrCat(op, ": layer ", layer, ": ", s.message()));
    }
    t.AddBlocks(ids.data(), int64_t(ids.size()));
    pages_held_ += missing;
  }
  if (absl::Status s = kernels_->AppendKv(ViewLocked(layer), pos, n, k.data, v.data); !s.ok()) {
    std::vector<int32_t> added;  // a device error: give back what this call took
    t.DropLastBlocks(missing, &added);
    FreeLocked(added, old_seq, old_mat);
    return absl::InternalError(absl::StrCat(op, ": layer ", layer, ": ", s.message()));
  }
  t.set_len(pos + n);
  EvictLocked(layer, pos);
  PublishLocked(old_seq, old_mat);
  return AppendResult{t.len(), SeqLenLocked()};
}

absl::StatusOr<AppendResult> KvCache::Append(int layer, int64_t pos, const TensorArg& k,
                                             const TensorArg& v) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckLayerLocked("append", layer); !s.ok()) return s;
  return AppendLocked("append", layer, pos, k, v);
}

absl::StatusOr<PopnResult> KvCache::Popn(int64_t n) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckLiveLocked(); !s.ok()) return s;
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("popn: n=", n, " < 0"));
  const int64_t seq = SeqLenLocked();
  PopnResult r{0, seq, ""};
  if (n == 0) return r;
  if (n > seq) {
    r.refusal = absl::StrCat("popn: n=", n, " but seq_len=", seq);
    CountRefusal();
    return r;
  }
  const int64_t end = seq - n;
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
  const int64_t old_mat = MaterializedLocked();
  std::vector<int32_t> freed;
  for (LayerTable& t : layers_) {
    if (t.len() > end) t.Truncate(end, spec_.page_size, &freed);
  }
  FreeLocked(freed, seq, old_mat);
  r.popped = n;
  r.seq_len = SeqLenLocked();
  return r;
}

absl::StatusOr<CacheInfo> KvCache::Reset(bool keep_pages) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckLiveLocked(); !s.ok()) return s;
  const int64_t old_seq = SeqLenLocked();
  const int64_t old_mat = MaterializedLocked();
  std::vector<int32_t> freed;
  for (LayerTable& t : layers_) t.Clear(keep_pages, &freed);
  FreeLocked(freed, old_seq, old_mat);
  return InfoLocked();
}

void KvCache::Release() {
  absl::MutexLock lock(&mu_);
  if (released_) return;
  const int64_t old_seq = SeqLenLocked();
  const int64_t old_mat = MaterializedLocked();
  std::vector<int32_t> freed;
  for (LayerTable& t : layers_) t.Clear(/*keep_pages=*/false, &freed);
  FreeLocked(freed, old_seq, old_mat);
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
  info.pool_id = pool_->id();
  info.page_bytes = pool_->page_bytes();
  return info;
}

absl::StatusOr<CacheInfo> KvCache::Info() {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckLiveLocked(); !s.ok()) return s;
  return InfoLocked();
}

absl::StatusOr<PageStats> KvCache::Stats() {
  const PoolStats pool = pool_->Stats();
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckLiveLocked(); !s.ok()) return s;
  PageStats st;
  st.pages_used = pages_held_;
  st.pages_free = pool.pages_free;
  st.num_pages = st.pages_used + st.pages_free;
  st.page_size = spec_.page_size;
  st.seq_len = SeqLenLocked();
  st.layers_materialized = MaterializedLocked();
  st.layers_total = spec_.num_layers;
  st.layers_sliding =
      std::count_if(spec_.layer_windows.begin(), spec_.layer_windows.end(), [](int w) { return w > 0; });
  st.bytes_used = uint64_t(pages_held_) * pool_->page_bytes();
  st.pages_evicted = pages_evicted_;
  st.refusals = refusals_.load(std::memory_order_relaxed);
  return st;
}

}  // namespace kvarena
