// CacheState: what every handle to one cache (the original and its clones) knows about it
// between calls — the layer lengths it last saw, the local path's block tables, and
// whether the cache is known to be gone. Shared by the handles through a shared_ptr.
//
// Thread-safety: safe for concurrent use; lengths and table are guarded by mu.
#ifndef KVARENA_CLIENT_CACHE_STATE_H_
#define KVARENA_CLIENT_CACHE_STATE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/local_table.h"
#include "core/types.h"
#include "kernels/kv_kernels.h"

namespace kvarena::client_internal {

struct CacheState {
  explicit CacheState(const CacheInfo& info)
      : table(info.spec.num_layers, info.spec.page_size), reserve_ahead(info.spec.page_size) {
    Update(info);
  }

  // From an answer that carries the whole cache (Allocate, Reset, Describe).
  void Update(const CacheInfo& info) {
    absl::MutexLock lock(&mu);
    layer_lens = info.layer_lens;
    layer_lens.resize(info.spec.num_layers, 0);
    seq_len = info.seq_len;
    cached_tokens = info.cached_tokens;
    tier_loaded_tokens = info.tier_loaded_tokens;
  }
  // Just allocated: no tokens, no pages, and the table knows it.
  void MarkEmpty() {
    absl::MutexLock lock(&mu);
    table.MarkEmpty();
  }
  // From Describe: lengths and the local table (its pending writes kept).
  void Load(const CacheDescription& d) {
    Update(d.info);
    absl::MutexLock lock(&mu);
    table.Load(d);
  }
  // From Commit of `tokens` tokens.
  void Committed(const CacheInfo& info, int64_t tokens) {
    Update(info);
    absl::MutexLock lock(&mu);
    if (table.fresh()) {
      table.ApplyCommit(info, tokens);
    } else {
      table.DropPending();  // commit checked they were exactly `tokens`
    }
  }
  // The arena changed the cache in a way the table does not follow (served writes, reset).
  void TableStale(bool drop_pending) {
    absl::MutexLock lock(&mu);
    table.MarkStale();
    if (drop_pending) table.DropPending();
  }
  // Uncommitted local writes are dropped; the arena did not change.
  void DropPending() {
    absl::MutexLock lock(&mu);
    table.DropPending();
  }
  void UpdateLayer(int layer, int64_t layer_len, int64_t new_seq_len) {
    absl::MutexLock lock(&mu);
    layer_lens[layer] = layer_len;
    seq_len = new_seq_len;
  }
  // After a popn whose Describe failed: every layer loses n tokens.
  void Popped(int64_t n, int64_t new_seq_len) {
    absl::MutexLock lock(&mu);
    for (int64_t& len : layer_lens) len = std::max<int64_t>(0, len - n);
    seq_len = new_seq_len;
    const int64_t cut = cached_tokens - std::min(cached_tokens, new_seq_len);
    cached_tokens -= cut;
    tier_loaded_tokens = std::max<int64_t>(0, tier_loaded_tokens - cut);  // the tail of cached
  }
  int64_t LayerLen(int layer) const {
    absl::MutexLock lock(&mu);
    return layer_lens[layer];
  }
  int64_t SeqLen() const {
    absl::MutexLock lock(&mu);
    return seq_len;
  }

  mutable absl::Mutex mu;
  std::vector<int64_t> layer_lens ABSL_GUARDED_BY(mu);
  int64_t seq_len ABSL_GUARDED_BY(mu) = 0;
  int64_t cached_tokens ABSL_GUARDED_BY(mu) = 0;
  int64_t tier_loaded_tokens ABSL_GUARDED_BY(mu) = 0;
  LocalTable table ABSL_GUARDED_BY(mu);
  int64_t reserve_ahead ABSL_GUARDED_BY(mu);  // tokens a Reserve RPC asks for at least
  // The pool as mapped here and the kernels for it, once looked up (kernels is stored
  // last, with release: a non-null kernels means pool_base is set).
  std::atomic<uint8_t*> pool_base{nullptr};
  std::atomic<KvKernels*> kernels{nullptr};
  std::atomic<bool> released{false};  // release() succeeded through some handle
  std::atomic<bool> gone{false};      // the arena answered NOT_FOUND for it
};

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_CACHE_STATE_H_
