// PagePool's warm chunks: empty chunks kept committed and resident instead of decommitted,
// so the pages a load or an append writes next are not faulted in on the request path
// (page_pool.h; StoreOptions::arena_warm_bytes).
#include "core/page_pool.h"

namespace kvarena {

void PagePool::AddEmptyLocked(int64_t delta) {
  empty_committed_ += delta;
  if (counters_ == nullptr || delta == 0) return;
  if (delta > 0) {
    counters_->warm_bytes.fetch_add(size_t(delta) * chunk_bytes_, std::memory_order_relaxed);
  } else {
    counters_->warm_bytes.fetch_sub(size_t(-delta) * chunk_bytes_, std::memory_order_relaxed);
  }
}

bool PagePool::KeepWarmLocked() const {
  if (empty_committed_ <= empty_chunks_kept_) return true;
  // The arena's count includes this chunk already: it stays when all of them fit.
  return counters_ != nullptr &&
         counters_->warm_bytes.load(std::memory_order_relaxed) <= counters_->warm_limit;
}

size_t PagePool::TrimEmpty(size_t bytes) {
  absl::MutexLock lock(&mu_);
  size_t freed = 0;
  for (int32_t c = 0; c < int32_t(chunks_.size()) && freed < bytes && empty_committed_ > 0; ++c) {
    if (!chunks_[c].committed || chunks_[c].used != 0) continue;
    DecommitChunkLocked(c);
    freed += chunk_bytes_;
  }
  return freed;
}

size_t PagePool::empty_bytes() const {
  absl::MutexLock lock(&mu_);
  return size_t(empty_committed_) * chunk_bytes_;
}

}  // namespace kvarena
