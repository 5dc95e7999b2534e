// PagePool: the pages of one geometry (num_kv_heads, head_dim, dtype, page_size), laid
// out contiguously in one reserved Region so a page id is an index from the pool base.
// ArenaBudget: the byte budget every pool of the arena commits chunks against.
//
// Memory is committed in chunks of whole pages (at least kChunkGranularity bytes) when
// pages are needed and decommitted when a chunk's pages are all free, keeping at most
// `empty_chunks_kept` empty chunks per pool to avoid churn. Allocate and Free are O(1)
// per page (amortised), except the commit/decommit of a chunk.
//
// Thread-safety: PagePool and ArenaBudget are safe for concurrent use; PagePool guards its
// state with an internal mutex (taken after any cache lock).
#ifndef KVARENA_CORE_PAGE_POOL_H_
#define KVARENA_CORE_PAGE_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "arena/region.h"
#include "core/types.h"
#include "kernels/paged_kv.h"

namespace kvarena {

class ArenaBudget {
 public:
  explicit ArenaBudget(size_t limit) : limit_(limit) {}
  ArenaBudget(const ArenaBudget&) = delete;
  ArenaBudget& operator=(const ArenaBudget&) = delete;

  // Charges `bytes` if they fit under the limit; false (nothing charged) otherwise.
  bool TryCharge(size_t bytes);
  void Refund(size_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }
  size_t used() const { return used_.load(std::memory_order_relaxed); }
  size_t limit() const { return limit_; }
  size_t available() const { return limit_ - used(); }

 private:
  const size_t limit_;
  std::atomic<size_t> used_{0};
};

// Bytes per chunk for pages of `page_bytes`: a whole number of pages, at least
// kChunkGranularity, and a multiple of it when that costs no more than 16 granules.
size_t ChunkBytesFor(size_t page_bytes);

class PagePool {
 public:
  // Reserves a range big enough for the whole budget. Nothing is committed yet.
  // RESOURCE_EXHAUSTED when not even one chunk fits the budget.
  static absl::StatusOr<std::unique_ptr<PagePool>> Create(uint64_t id, const PageLayout& layout,
                                                          Backend* backend, ArenaBudget* budget,
                                                          int empty_chunks_kept);
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // Appends n page ids to *out, all or nothing. RESOURCE_EXHAUSTED (naming the numbers)
  // when the arena budget cannot cover the chunks they need.
  // *committed (when given) receives the chunks this call committed, for Unallocate.
  absl::Status Allocate(int64_t n, std::vector<int32_t>* out,
                        std::vector<int32_t>* committed = nullptr);
  // REQUIRES: every id was allocated from this pool and not yet freed.
  void Free(absl::Span<const int32_t> ids);
  // Undoes an Allocate: frees ids and decommits the chunks it committed that are empty
  // again, so a refused request leaves the pool's memory as it found it.
  void Unallocate(absl::Span<const int32_t> ids, absl::Span<const int32_t> committed);

  uint64_t id() const { return id_; }
  const PageLayout& layout() const { return layout_; }
  size_t page_bytes() const { return page_bytes_; }
  size_t chunk_bytes() const { return chunk_bytes_; }
  uint8_t* base() const { return region_->base(); }
  const Region& region() const { return *region_; }

  // pages_used, pages_free (committed free + what the budget could still commit),
  // chunks, bytes. num_caches is left for the caller.
  PoolStats Stats() const;
  int64_t pages_used() const;

  // Whether page `id` is currently allocated (tests: no page has two owners).
  bool TEST_IsAllocated(int32_t id) const;

 private:
  struct Chunk {
    bool committed = false;
    int32_t used = 0;
    int32_t open_index = -1;      // position in open_chunks_, -1 when full or uncommitted
    std::vector<int32_t> free;    // free page ids, popped from the back
    std::vector<bool> taken;      // by page index in the chunk: allocated now
  };

  PagePool(uint64_t id, const PageLayout& layout, std::unique_ptr<Region> region,
           ArenaBudget* budget, size_t chunk_bytes, int empty_chunks_kept);

  int64_t FreeCommittedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CommitChunksLocked(int64_t count, std::vector<int32_t>* committed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeLocked(absl::Span<const int32_t> ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DecommitChunkLocked(int32_t c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OpenLocked(int32_t c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseLocked(int32_t c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t id_;
  const PageLayout layout_;
  const size_t page_bytes_;
  const size_t chunk_bytes_;
  const int32_t pages_per_chunk_;
  const int empty_chunks_kept_;
  const std::unique_ptr<Region> region_;
  ArenaBudget* const budget_;

  mutable absl::Mutex mu_;
  std::vector<Chunk> chunks_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> open_chunks_ ABSL_GUARDED_BY(mu_);    // committed, with free pages
  std::vector<int32_t> uncommitted_ ABSL_GUARDED_BY(mu_);    // lowest index at the back
  int64_t pages_used_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t chunks_committed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t empty_committed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvarena

#endif  // KVARENA_CORE_PAGE_POOL_H_
