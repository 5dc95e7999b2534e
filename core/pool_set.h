// PoolSet: the arena's pools, one per PoolKey (owner and geometry) — found by key or id, counted
// by the caches drawn from each — and the rules over them: a new geometry gets a pool
// while fewer than max_pools are alive (displacing an idle pool kept only for its cached
// pages), a pool goes when no cache draws from it and it caches no page, and a pool short
// of budget takes it from the other pools' cached pages (TrimOthers).
//
// Pools are shared with the caches drawn from them: a pool leaves the set when its last
// cache is released and is destroyed (its memory given back) when the last cache object
// referring to it goes.
//
// Thread-safety: safe for concurrent use; its place in the lock order is DESIGN.md's
// ("Locks"). TrimOthers runs under cache locks, so it takes no store lock, and it calls
// the other pools with the set's lock released.
#ifndef KVARENA_CORE_POOL_SET_H_
#define KVARENA_CORE_POOL_SET_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "arena/region.h"
#include "core/page_pool.h"
#include "core/types.h"

namespace kvarena {

// A pool per owner (tenant; "" without tenants) and geometry: two owners never share a
// pool, so a session maps only its own owner's pages.
struct PoolKey {
  std::string owner;
  int dtype = 0;
  int page_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int kv_format = 0;  // resolved
  PoolKey(std::string o, const PageLayout& l)
      : owner(std::move(o)),
        dtype(int(l.dtype)),
        page_size(l.page_size),
        num_kv_heads(l.num_kv_heads),
        head_dim(l.head_dim),
        kv_format(int(l.format())) {}
  friend bool operator<(const PoolKey& a, const PoolKey& b) {
    return std::tie(a.owner, a.dtype, a.page_size, a.num_kv_heads, a.head_dim, a.kv_format) <
           std::tie(b.owner, b.dtype, b.page_size, b.num_kv_heads, b.head_dim, b.kv_format);
  }
  friend bool operator==(const PoolKey& a, const PoolKey& b) { return !(a < b) && !(b < a); }
};

class PoolSet {
 public:
  // Everything but counters (optional) must be given; all must outlive the set.
  PoolSet(Backend* backend, ArenaBudget* budget, int max_pools, int empty_chunks_kept,
          PoolCounters* counters);
  PoolSet(const PoolSet&) = delete;
  PoolSet& operator=(const PoolSet&) = delete;

  // owner's pool of a resolved spec's geometry, created when new (*created set). At max_pools a
  // pool no cache draws from gives way first; RESOURCE_EXHAUSTED (max_pools, naming it)
  // when none does, or what PagePool::Create refused, prefixed "allocate: ". The pool that
  // gave way (its memory, its cached pages going down to the tiers: GBs) is handed to
  // *displaced, for the caller to let go of once it holds no lock of its own; with
  // displaced null it goes when PoolFor returns, after the set's lock.
  absl::StatusOr<std::shared_ptr<PagePool>> PoolFor(const CacheSpec& spec, const std::string& owner,
                                                    bool* created,
                                                    std::shared_ptr<PagePool>* displaced = nullptr);
  // The pool of that id, or null when there is none (any more).
  std::shared_ptr<PagePool> Find(uint64_t id) const;
  // The same, null also when the pool is another owner's.
  std::shared_ptr<PagePool> Find(uint64_t id, const std::string& owner) const;
  // Whether `pool` itself (not only its id) is in the set.
  bool Contains(const PagePool* pool) const;

  // A cache drawn from pool id is born / gone (REQUIRES: the pool is in the set).
  void AddCache(uint64_t id);
  void RemoveCache(uint64_t id);
  // Drops `pool` when no cache draws from it and it caches no page; whether it did.
  bool DropIfUnused(const PagePool* pool);
  // Drops every such pool; returns how many.
  int DropIdle();
  // Drops every pool (the store going away): each is destroyed, its cached pages going
  // down to the tiers, once no cache holds it.
  void Clear();

  // When `pool` lacks budget for n pages: reclaims cached pages of the other pools until
  // that much went back — only if they can give it all, so a refusal changes nothing.
  // True when it freed the shortfall. REQUIRES: no pool lock held.
  bool TrimOthers(const PagePool* pool, int64_t n);
  // Reclaims `bytes` from the cached pages of the pools not in `keep`, only if they can
  // give it all; whether they did.
  bool TrimAllBut(absl::Span<const std::pair<PagePool*, int64_t>> keep, size_t bytes);
  // Decommits empty (warm) chunks of every pool until `bytes` went back to the budget —
  // only if they can give it all; whether they did (a scratch region needs the budget).
  bool TrimEmpty(size_t bytes);
  // pool->Allocate, retried once after TrimOthers when the arena is full, or after
  // ReclaimMetadata when the metadata budget could not cover the page bookkeeping of the
  // chunks it would commit.
  absl::Status Allocate(PagePool* pool, int64_t n, std::vector<int32_t>* ids,
                        std::vector<int32_t>* committed);
  // pool->Allocate, retried once after ReclaimMetadata (see Allocate).
  absl::Status AllocateIn(PagePool* pool, int64_t n, std::vector<int32_t>* ids,
                          std::vector<int32_t>* committed,
                          int64_t max_new_chunks = PagePool::kAnyChunks);
  // Allocate for one call that takes pages from several pools at once (KvStore::Reserve),
  // each pair a pool and its page count: plans how many chunks each commits and how many
  // cached pages each reclaims so that all of them fit together, trims other pools'
  // cached pages for what the budget lacks, then allocates each into (*ids)[pool] and
  // (*committed)[pool]. When they cannot all fit it refuses before any pool changed; a
  // refusal after that (the budget taken by another caller meanwhile) leaves what it
  // took in the maps, for the caller to Unallocate. REQUIRES: no pool lock held.
  using PoolPages = absl::flat_hash_map<PagePool*, std::vector<int32_t>>;
  absl::Status AllocateTogether(absl::Span<const std::pair<PagePool*, int64_t>> needs,
                                PoolPages* ids, PoolPages* committed);
  // Evicts cached pages of every pool, the least recently cached of the whole arena first
  // (their nodes and, once unreferenced, their chunks giving their metadata back), until
  // done() or no pool caches a page. Whether done() holds at the end. done() may read
  // atomics only (it runs under pool locks). REQUIRES: no pool lock held.
  bool ReclaimMetadata(const std::function<bool()>& done);
  // What ReclaimMetadata could give back at most now (PagePool::FreeableMetadataBytes of
  // every pool). REQUIRES: no pool lock held.
  size_t FreeableMetadataBytes() const;

  // Every pool, by id, with its owner and the caches drawn from it.
  struct Entry {
    std::shared_ptr<PagePool> pool;
    std::string owner;
    int64_t num_caches = 0;
  };
  std::vector<Entry> List() const;
  size_t size() const;

  // INTERNAL when the key and id maps or the cache counts disagree.
  absl::Status TEST_Audit() const;

 private:
  // The key pool id is filed under. REQUIRES: it is in the set.
  PoolKey KeyOfLocked(uint64_t id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int64_t CachesLocked(uint64_t id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Takes pool id out of the maps and returns it (for the caller to let go of after the
  // lock). REQUIRES: it is there.
  std::shared_ptr<PagePool> EraseLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool DropIfUnusedLocked(const PagePool* pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pools of the set that are not in `keep`.
  std::vector<std::shared_ptr<PagePool>> AllBut(
      absl::Span<const std::pair<PagePool*, int64_t>> keep) const;
  // s, or the allocation retried once after ReclaimMetadata when s is a refusal for the
  // metadata budget that evicting cached pages can lift.
  absl::Status RetryForMetadata(absl::Status s, PagePool* pool, int64_t n,
                                std::vector<int32_t>* ids, std::vector<int32_t>* committed,
                                int64_t max_new_chunks);

  Backend* const backend_;
  ArenaBudget* const budget_;
  const int max_pools_;
  const int empty_chunks_kept_;
  PoolCounters* const counters_;

  mutable absl::Mutex mu_;
  std::map<PoolKey, std::shared_ptr<PagePool>> by_key_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<PagePool>> by_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, int64_t> caches_ ABSL_GUARDED_BY(mu_);     // per pool id
  absl::flat_hash_map<uint64_t, std::string> owner_ ABSL_GUARDED_BY(mu_);  // PoolKey::owner
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvarena

#endif  // KVARENA_CORE_POOL_SET_H_
