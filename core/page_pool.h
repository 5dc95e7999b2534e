// PagePool: the pages of one geometry (num_kv_heads, head_dim, dtype, page_size), laid
// out contiguously in one reserved Region so a page id is an index from the pool base.
// ArenaBudget: the byte budget every pool of the arena commits chunks against.
//
// Memory is committed in chunks of whole pages (at least kChunkGranularity bytes) when
// pages are needed (pre-faulted then, with PoolCounters::prefault) and decommitted when a
// chunk's pages are all free — unless the pool keeps it warm, committed and resident: its
// first `empty_chunks_kept` empty chunks, and more while the empty chunks of every pool
// stay within PoolCounters::warm_limit (page_pool_warm.cc). Warm chunks give way to any
// other use of the budget (TrimCached, TrimEmpty). Allocate and Free are O(1) per page
// (amortised), except the commit/decommit of a chunk.
//
// Pages are reference-counted: a page taken by Allocate has one reference, Ref adds one
// (a fork sharing it), Free drops one. A page whose last reference drops returns to the
// free list — unless it is registered in the pool's PrefixIndex (content-addressed, for
// prefix reuse): then it goes to the pool's PageCache (core/page_cache.h), still indexed,
// reclaimable, until a cache adopts it again (AdoptPrefix) or the cache evicts it — for an
// Allocate that found no free page and no budget (the cache's policy picks the page), or
// for TrimCached (the pool picks the chunks). Registered pages are immutable: callers
// write only pages that are Writable (one reference, not registered).
//
// Thread-safety: PagePool and ArenaBudget are safe for concurrent use; PagePool guards its
// state (the PrefixIndex and PageCache included) with an internal mutex (its place in
// the lock order: DESIGN.md, "Locks"), so a prefix lookup and the adoption of what it
// found are one step no eviction can split.
#ifndef KVARENA_CORE_PAGE_POOL_H_
#define KVARENA_CORE_PAGE_POOL_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "arena/region.h"
#include "core/byte_budget.h"
#include "core/page_cache.h"
#include "core/prefix_events.h"
#include "core/prefix_index.h"
#include "core/types.h"
#include "kernels/paged_kv.h"

namespace kvarena {

// The arena budget is a ByteBudget of --arena_bytes.
using ArenaBudget = ByteBudget;

// Bytes per chunk for pages of `page_bytes`: a whole number of pages, at least
// kChunkGranularity, and a multiple of it when that costs no more than 16 granules.
size_t ChunkBytesFor(size_t page_bytes);

class KvKernels;
class TierSet;

// Arena-wide counts of what pools did for prefix reuse (owned by the store).
struct PoolCounters {
  std::atomic<uint64_t> pages_reclaimed{0};  // cached pages reclaimed for new allocations
  // Cached pages evicted to give metadata back (PoolSet::ReclaimMetadata).
  std::atomic<uint64_t> pages_reclaimed_for_metadata{0};
  // Metadata bytes of the index nodes no cache holds, in every pool: what cached
  // prefixes keep of the metadata budget (PrefixIndex::unheld_bytes).
  std::atomic<size_t> cached_metadata{0};
  std::atomic<uint64_t> cache_clock{0};  // the stamps of every pool's PageCache
  PrefixEventLog* events = nullptr;      // where pools record index changes, if anywhere
  ByteBudget* metadata =
      nullptr;                   // charged with index nodes and committed chunks' page bookkeeping
  TierSet* tiers = nullptr;      // the tiers below the arena, if any (core/tier_set.h)
  KvKernels* kernels = nullptr;  // copies chunks' pages out to the tiers (with tiers)
  // Empty chunks every pool keeps committed and resident (warm) beyond its
  // empty_chunks_kept, in bytes (StoreOptions::arena_warm_bytes); and what they hold now,
  // the first empty_chunks_kept of each pool included.
  size_t warm_limit = 0;
  std::atomic<size_t> warm_bytes{0};
  bool prefault = false;  // new chunks are faulted in when committed (Region::Prefault)
};

// The first block a layer of window `window` (0: global) needs when the next position is
// blocks * page_size: a query there sees keys in (p - window, p].
inline int64_t FirstBlockNeeded(int window, int64_t blocks, int page_size) {
  if (window == 0) return 0;
  return std::max<int64_t>(0, blocks * page_size - window + 1) / page_size;
}

// A prefix to look up and adopt (AdoptPrefix), for a cache of num_layers layers.
struct PrefixQuery {
  std::string root_key;  // namespace and geometry, exactly (ResolvedRootKey)
  std::string prefix_namespace;
  Hash128 root_hash;
  uint64_t scales_digest = 0;  // StaticScalesDigest: what the tiers' chunks state
  int num_layers = 0;
  int page_size = 0;
  std::vector<int> layer_windows;   // per layer
  const Hash128* hashes = nullptr;  // [num_blocks] chained page hashes of the prompt
  const int32_t* tokens = nullptr;  // [num_blocks * page_size] its token ids
  int64_t num_blocks = 0;           // full pages of declared tokens
  int64_t max_adopt = 0;            // adopt at most this many leading pages
  // Charges the quota for n adopted pages; false: adopt nothing.
  std::function<bool(int64_t)> charge;
};

// A cache's holds on the index: the root and one node per full page of declared tokens.
// Guarded by its cache's lock; PagePool's methods change the index through it under the pool's
// lock (a long chain in batches, releasing the lock between them).
struct PrefixChain {
  uint64_t root = PrefixIndex::kNoNode;
  std::vector<uint64_t> nodes;  // nodes[b]: the node of block b
  bool blocked = false;         // a collision stopped the chain; it grows no further
};

// What AdoptPrefix found: `blocks` leading pages hit; per layer the pages adopted
// (blocks [first_block, blocks)) — a sliding layer needs only what its window still sees.
struct PrefixHit {
  int64_t blocks = 0;
  std::vector<int64_t> first_block;
  std::vector<std::vector<int32_t>> pages;
  int64_t pages_adopted = 0;
};

// One page to index: block `node` of a chain, `layer`, held by the caller.
struct PageToRegister {
  uint64_t node = PrefixIndex::kNoNode;
  int layer = 0;
  int32_t page = -1;
};

class PagePool {
 public:
  // Reserves a range big enough for the whole budget. Nothing is committed yet.
  // RESOURCE_EXHAUSTED when not even one chunk fits the budget.
  // counters (optional) must outlive the pool.
  static absl::StatusOr<std::unique_ptr<PagePool>> Create(uint64_t id, const PageLayout& layout,
                                                          Backend* backend, ArenaBudget* budget,
                                                          int empty_chunks_kept,
                                                          PoolCounters* counters = nullptr,
                                                          std::string owner = "");
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // Appends n page ids to *out (one reference each), all or nothing: free pages of
  // committed chunks, then new chunks the budget covers, then cached pages reclaimed
  // (unregistered; least recently cached first). RESOURCE_EXHAUSTED (naming the numbers)
  // when all of those together fall short; then nothing is reclaimed.
  // *committed (when given) receives the chunks this call committed, for Unallocate.
  // At most max_new_chunks new chunks are committed (a plan made for several pools at
  // once, PoolSet::AllocateTogether); the rest comes from cached pages.
  static constexpr int64_t kAnyChunks = std::numeric_limits<int64_t>::max();
  absl::Status Allocate(int64_t n, std::vector<int32_t>* out,
                        std::vector<int32_t>* committed = nullptr,
                        int64_t max_new_chunks = kAnyChunks);
  // Drops one reference of each id, in order (a registered page losing its last one
  // becomes the most recently cached: free a chain's tail before its head).
  // REQUIRES: every id is referenced.
  void Free(absl::Span<const int32_t> ids);
  // One more reference to each id. REQUIRES: every id is referenced.
  void Ref(absl::Span<const int32_t> ids);
  // Undoes an Allocate: frees ids and decommits the chunks it committed that are empty
  // again, so a refused request leaves the pool's memory as it found it (pages it
  // reclaimed stay reclaimed: their cached K/V are gone).
  void Unallocate(absl::Span<const int32_t> ids, absl::Span<const int32_t> committed);
  // Whether a caller holding page id may write it: it is the only reference and the page
  // is not registered.
  bool Writable(int32_t id) const;
  // Bytes TrimCached could give back to the budget: chunks holding only cached pages, and
  // empty committed chunks.
  size_t ReclaimableBytes() const;
  // Gives committed memory back to the budget (another pool needs it) until `bytes` went
  // back or ReclaimableBytes() is 0: decommits empty chunks, then reclaims the cached
  // pages of chunks that hold nothing else, least recently cached first, and decommits
  // those. Returns the bytes freed.
  size_t TrimCached(size_t bytes);
  // Decommits empty chunks (warm ones included) until `bytes` went back to the budget or
  // none is left; returns the bytes freed (page_pool_warm.cc).
  size_t TrimEmpty(size_t bytes);
  // Bytes of the pool's empty committed chunks (kept warm).
  size_t empty_bytes() const;
  // Budget bytes that Allocate(n) lacks now, beyond this pool's free and cached pages.
  size_t BudgetShortfall(int64_t n) const;
  // Whether Allocate(n) would find the pages now (free, budget, cached).
  bool CanAllocate(int64_t n) const;
  // What Allocate could draw on now, besides the budget.
  struct Supply {
    int64_t free_pages = 0;    // in committed chunks, taken by nobody
    int64_t cached_pages = 0;  // reclaimable in place
    int64_t uncommitted_chunks = 0;
    int64_t pages_per_chunk = 1;
    size_t chunk_bytes = 0;
  };
  Supply supply() const;
  // The budget this pool commits chunks against (its owner's, under the arena's).
  const ArenaBudget& budget() const { return *budget_; }
  // The page bookkeeping (metadata bytes) of the chunks n more pages could need committed.
  size_t MetadataBytesFor(int64_t n) const {
    return size_t(n / pages_per_chunk_ + (n % pages_per_chunk_ != 0)) * ChunkMetadataBytes();
  }

  // --- prefix reuse (core/prefix_index.h); all under the pool's lock ---
  // Extends *chain over blocks [chain->nodes.size(), num_blocks) of hashes/tokens,
  // holding each node (creating those that are new), first the root when chain has none.
  // Stops for good (chain->blocked) at a block whose hash names another prefix, or where
  // the metadata budget cannot cover a new node.
  void ExtendChain(const PrefixQuery& q, PrefixChain* chain);
  // ExtendChain, then finds the longest run of leading blocks b < q.max_adopt whose pages
  // every layer needs are cached (a global layer: blocks [0, b); a sliding layer of window
  // w: those a query at position b * page_size still sees), charges q.charge for them and
  // adopts them (one reference each), all in one step. *hit is empty on a miss or when
  // the charge is refused.
  void AdoptPrefix(const PrefixQuery& q, PrefixChain* chain, PrefixHit* hit);
  // Indexes each page (held by the caller, full, its tokens those of the node) unless
  // its node already names a page for that layer. Returns how many were indexed.
  int64_t Register(absl::Span<const PageToRegister> pages);
  // Drops the chain's holds (nodes from `from` on; the root too when from == 0) and
  // shortens it to `from` nodes.
  void TruncateChain(PrefixChain* chain, size_t from);
  // Another hold on each node of chain (a fork copies it).
  void HoldChain(const PrefixChain& chain);
  int64_t pages_cached() const;
  // The metadata bytes evicting every cached page would give back: the index nodes that
  // would go with them (PrefixIndex::FreeableBytes; chunks' page bookkeeping not counted).
  size_t FreeableMetadataBytes() const;
  // The PageCache stamp of the cached page this pool gives up first (PageCache::kNoStamp:
  // none cached).
  uint64_t OldestCachedStamp() const;
  // Evicts cached pages, least recently cached first, and frees them: while their stamp is
  // below `before`, `done()` is false and fewer than max_pages went. Their nodes go when
  // nothing else keeps them, giving their metadata back. Returns the pages evicted.
  // `done` must not call the pool (it runs under its lock).
  int64_t EvictCachedBefore(uint64_t before, const std::function<bool()>& done, int64_t max_pages);

  // --- tiers (core/tier_set.h; page_pool_tiers.cc) ---
  // The tenant whose caches draw from the pool ("" without tenants): part of every chunk's
  // identity, so no tier hands one tenant's K/V to another.
  const std::string& owner() const { return owner_; }
  // Pages a cache loaded from a tier (fresh: one reference each, written with the chunk's
  // K/V of the node's tokens) become their node's page for their layer, recorded as
  // BlockStored — unless the node names a page for that layer already (another cache
  // loaded or computed it meanwhile): then that page is adopted (one reference) in its
  // place and the fresh one freed. Each item's page becomes the page the caller holds.
  void InstallLoaded(absl::Span<PageToRegister> pages);

  uint64_t id() const { return id_; }
  const PageLayout& layout() const { return layout_; }
  size_t page_bytes() const { return page_bytes_; }
  size_t chunk_bytes() const { return chunk_bytes_; }
  uint8_t* base() const { return region_->base(); }
  const Region& region() const { return *region_; }

  // pages_used (referenced by caches), pages_cached, pages_shared, pages_free (committed
  // free + what the budget could still commit + cached, reclaimable pages),
  // chunks, bytes. num_caches is left for the caller.
  PoolStats Stats() const;
  int64_t pages_used() const;  // referenced by caches (cached pages not included)

  // The audit (page_pool_audit.cc).
  // What the pool holds of the metadata budget: its index's nodes and its committed
  // chunks' page bookkeeping (0 without a budget).
  size_t TEST_MetadataBytes() const;
  // Whether page `id` is referenced by some cache.
  bool TEST_IsAllocated(int32_t id) const;
  // References to page id (0 when free or cached).
  int32_t TEST_Refs(int32_t id) const;
  // Checks the pool against what the caches hold: refs[page] references to each page
  // (every other page free or cached), holds[node] holds on each index node, the index
  // consistent. INTERNAL naming the first discrepancy.
  absl::Status TEST_Audit(const absl::flat_hash_map<int32_t, int32_t>& refs,
                          const absl::flat_hash_map<uint64_t, int64_t>& holds) const;

 private:
  struct Chunk {
    bool committed = false;
    int32_t used = 0;
    int32_t open_index = -1;    // position in open_chunks_, -1 when full or uncommitted
    std::vector<int32_t> free;  // free page ids, popped from the back
    std::vector<bool> taken;    // by page index in the chunk: referenced or cached
    std::vector<int32_t> refs;  // by page index in the chunk: references
    int32_t cached = 0;         // taken pages with no reference (parked in the index)
  };

  PagePool(uint64_t id, const PageLayout& layout, std::unique_ptr<Region> region,
           ArenaBudget* budget, size_t chunk_bytes, int empty_chunks_kept, PoolCounters* counters,
           std::string owner);

  // Page bookkeeping charged to the metadata budget with each committed chunk: per page
  // its free-list entry, reference count and taken bit, and one cache's table slot.
  static constexpr size_t kPageMetadataBytes = 16;
  size_t ChunkMetadataBytes() const { return size_t(pages_per_chunk_) * kPageMetadataBytes; }
  ByteBudget* Metadata() const { return counters_ != nullptr ? counters_->metadata : nullptr; }
  int64_t FreeCommittedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CommitChunksLocked(int64_t count, std::vector<int32_t>* committed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns ids (no references, not cached) to the free lists; force_decommit empties
  // chunks regardless of empty_chunks_kept.
  void FreeLocked(absl::Span<const int32_t> ids, bool force_decommit = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int32_t& RefsLocked(int32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return chunks_[size_t(id / pages_per_chunk_)].refs[size_t(id % pages_per_chunk_)];
  }
  int32_t RefsLocked(int32_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return chunks_[size_t(id / pages_per_chunk_)].refs[size_t(id % pages_per_chunk_)];
  }
  Chunk& ChunkOf(int32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return chunks_[size_t(id / pages_per_chunk_)];
  }
  // Moves a registered page with no reference into / out of the page cache.
  void ParkLocked(int32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnparkLocked(int32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the page the cache gives up first for a new owner (one reference).
  int32_t ReclaimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The page cache's eviction callback: page (registered) leaves the index, recorded as
  // BlockRemoved; it stays taken, for the caller of the eviction to reuse or free.
  void EvictedLocked(int32_t page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Indexes page as node's page for layer (false: the node names one already) and records
  // BlockStored; a full chunk it completes goes to the write-through tiers.
  bool RegisterLocked(uint64_t node, int layer, int32_t page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tiers, when they take chunks of this pool's kind (full / evicted), else null.
  TierSet* TiersFor(uint8_t flag) const;
  // Whether node is the last block of a chunk of the tiers'.
  bool EndsChunkLocked(uint64_t node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The last node of the chunk holding node (following the most recent child down), when
  // it exists and names a page for every layer; else kNoNode.
  uint64_t ChunkEndLocked(uint64_t node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the chunk ending at node `last` to the tiers (once per flag: kTierFull for a full
  // chunk just registered, kTierEvicted for one being evicted), each layer's pages from the
  // first of the run ending at the chunk's last block that the index still holds. `after`
  // (the eviction's BlockRemoved) is recorded once the tiers wrote it. Nothing is copied
  // when the tiers' queue has no room (the chunk stays eligible). `attempts`: writes of
  // it that failed before.
  void CaptureChunkLocked(uint64_t last, uint8_t flag, std::vector<PrefixEvent> after,
                          int attempts = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes back the write-through chunks no store took (TierSet::TakeReturns): clears
  // their flags and offers again those that are due.
  void TakeTierReturnsLocked(TierSet* tiers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordLocked(PrefixEvent e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExtendChainLocked(const PrefixQuery& q, PrefixChain* chain)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes n free pages of committed chunks (REQUIRES: that many are free).
  void TakeFreeLocked(int64_t n, std::vector<int32_t>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DecommitChunkLocked(int32_t c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // empty_committed_ += delta, and the arena's count of warm bytes with it.
  void AddEmptyLocked(int64_t delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a chunk that just emptied (counted in empty_committed_) stays committed.
  bool KeepWarmLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  PoolCounters* const counters_;
  const std::string owner_;

  mutable absl::Mutex mu_;
  std::vector<Chunk> chunks_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> open_chunks_ ABSL_GUARDED_BY(mu_);  // committed, with free pages
  std::vector<int32_t> uncommitted_ ABSL_GUARDED_BY(mu_);  // lowest index at the back
  int64_t pages_used_ ABSL_GUARDED_BY(mu_) = 0;            // taken: referenced or cached
  int64_t pages_shared_ ABSL_GUARDED_BY(mu_) = 0;          // with two or more references
  PrefixIndex index_ ABSL_GUARDED_BY(mu_);
  const std::unique_ptr<PageCache> cache_
      ABSL_PT_GUARDED_BY(mu_);  // registered pages no cache references
  int64_t chunks_committed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t empty_committed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvarena

#endif  // KVARENA_CORE_PAGE_POOL_H_
