// PageCache: the reclaimable pages of one pool and the policy that picks which goes first,
// in the spirit of LevelDB's Cache (include/leveldb/cache.h). A page enters when it is
// registered in the pool's PrefixIndex and its last reference drops (Insert): its K/V stay
// valid and indexed, for a cache to adopt again (Erase takes it back out, untouched), until
// the pool needs the page for a new owner (Evict: the policy's choice) or gives its chunk
// back to the budget (Evict(page): the pool's choice). NewLruPageCache evicts the least
// recently inserted page first; callers insert a chain's tail before its head, so heads
// outlive tails.
//
// Every eviction calls the `on_evict` callback given at construction, with the page out of
// the cache but still registered and its K/V intact; the page is reused (or decommitted)
// only after it returns.
// The pool's callback unregisters the page and records BlockRemoved. A tier plugs in
// there, as a sink of evicted chunks: it reads the page's identity from the index (node,
// layer, namespace, parent hash, token ids) and copies its K/V out before the page goes —
// no edit to the allocator (PagePool) or to this policy.
//
// Each insertion takes a stamp from a clock the arena's pools share, so the pools' caches
// together are one LRU order: the page with the oldest stamp of all goes first when the
// arena reclaims cached pages for metadata (PoolSet::ReclaimMetadata).
//
// Not thread-safe: the owning PagePool's lock guards it, and on_evict runs under it.
#ifndef KVARENA_CORE_PAGE_CACHE_H_
#define KVARENA_CORE_PAGE_CACHE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

namespace kvarena {

class PageCache {
 public:
  // Called with each page the cache evicts, before Evict returns.
  using EvictCallback = std::function<void(int32_t page)>;

  virtual ~PageCache() = default;

  // The page (registered, its last reference just dropped) becomes reclaimable, as the
  // most recently inserted. REQUIRES: !Lookup(page).
  virtual void Insert(int32_t page) = 0;
  // Whether the page is in the cache (reclaimable).
  virtual bool Lookup(int32_t page) const = 0;
  // Takes the page out without evicting it: a cache references it again (adoption).
  // REQUIRES: Lookup(page).
  virtual void Erase(int32_t page) = 0;
  // Evicts the page the policy gives up first and returns it. REQUIRES: size() > 0.
  virtual int32_t Evict() = 0;
  // Evicts this page. REQUIRES: Lookup(page).
  virtual void Evict(int32_t page) = 0;
  virtual int64_t size() const = 0;
  // The pages, in the order Evict() would take them.
  virtual std::vector<int32_t> EvictionOrder() const = 0;
  // The stamp of the page Evict() would take; kNoStamp when the cache is empty.
  static constexpr uint64_t kNoStamp = std::numeric_limits<uint64_t>::max();
  virtual uint64_t OldestStamp() const = 0;
};

// Least recently inserted first. on_evict must be callable for the cache's lifetime; so
// must `clock` (the stamps' source, shared by the arena's pools), when given.
std::unique_ptr<PageCache> NewLruPageCache(PageCache::EvictCallback on_evict,
                                           std::atomic<uint64_t>* clock = nullptr);

}  // namespace kvarena

#endif  // KVARENA_CORE_PAGE_CACHE_H_
