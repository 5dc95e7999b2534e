// The state behind KvStore, shared by its implementation files (kv_store.cc: caches;
// kv_store_sessions.cc; kv_store_views.cc: stats, the cache list;
// kv_store_local.cc: the local path; kv_store_prefix.cc: SetTokens, Fork, trimming;
// kv_store_regions.cc: sharing; kv_store_audit.cc: the TEST_ audit).
// Internal to core/.
//
// Thread-safety: as KvStore; `mu` guards the cache maps, the pool set, each cache and pool
// lock themselves. The pool set changes (a pool created or dropped, a cache counted) only
// under `mu`, so an Allocate's pool and its count are one step no drop can split.
// (core/pool_set.h: the pools.)
#ifndef KVARENA_CORE_KV_STORE_IMPL_H_
#define KVARENA_CORE_KV_STORE_IMPL_H_

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "core/kv_cache.h"
#include "core/kv_store.h"
#include "core/page_pool.h"
#include "core/pool_set.h"
#include "core/quota.h"
#include "core/session_table.h"
#include "core/tier_set.h"
#include "core/validate.h"
#include "kernels/kv_kernels.h"

namespace kvarena {

struct KvStore::Impl {
  Impl(const StoreOptions& o, std::unique_ptr<Backend> b)
      : options(o),
        backend(std::move(b)),
        scratch_backend(NewHostBackend()),
        budget(o.arena_bytes),
        metadata(o.metadata_bytes, nullptr, "metadata_bytes"),
        kernels(o.kernels ? o.kernels
                          : std::shared_ptr<KvKernels>(NewCpuKvKernels(
                                o.num_threads, absl::ToChronoMicroseconds(o.cpu_pool_awake)))),
        limits(LimitsOf(kernels->limits(), o)),
        clock(o.clock ? o.clock : RealClock()),
        events(o.prefix_event_capacity, o.prefix_event_bytes),
        sessions(o.max_sessions, o.max_sessions_per_peer),
        cached_metadata_limit(o.cached_metadata_bytes == 0
                                  ? o.metadata_bytes / 2
                                  : std::min(o.cached_metadata_bytes, o.metadata_bytes)),
        owners(OwnersOf(o, &metadata)),
        sessionless(NewQuota("")),
        pools(backend.get(), &budget, o.max_pools, o.empty_chunks_kept, &pool_counters) {
    pool_counters.events = &events;
    pool_counters.metadata = &metadata;
    pool_counters.tiers = o.tiers.get();
    pool_counters.kernels = kernels.get();
    pool_counters.warm_limit = o.arena_warm_bytes;
    pool_counters.prefault = o.arena_prefault;
    if (o.tiers) o.tiers->SetEvents(&events);
    if (o.on_prefix_events) events.SetListener(o.on_prefix_events);
  }

  static RequestLimits LimitsOf(const KernelLimits& k, const StoreOptions& o) {
    RequestLimits l = LimitsFor(k, o.max_request_tokens);
    l.max_attend_work = o.max_attend_work;
    return l;
  }

  // The live cache named id, if `session` may touch it; marks it used.
  absl::StatusOr<std::shared_ptr<KvCache>> Find(const std::string& session, const std::string& id,
                                                bool check_owner = true) const;
  absl::Status CheckSession(const std::string& session) const;
  // Takes cache out of the maps (REQUIRES: it is there) and releases its pages; tells
  // workers when that emptied a pool.
  void Remove(const std::shared_ptr<KvCache>& cache);
  CacheContext ContextFor(std::shared_ptr<PagePool> pool, std::shared_ptr<Quota> quota);
  // A quota of owner's: a session's (the sessionless caches share one per owner), its
  // metadata inside `metadata`, inside the owner's quota when StoreOptions::owners lists it.
  std::shared_ptr<Quota> NewQuota(const std::string& owner) {
    auto it = owners.find(owner);
    if (it == owners.end()) {
      return std::make_shared<Quota>(options.max_caches_per_session, options.session_max_pages,
                                     options.session_metadata_bytes, &metadata);
    }
    return std::make_shared<Quota>(options.max_caches_per_session, options.session_max_pages,
                                   options.session_metadata_bytes, it->second.total->metadata(),
                                   it->second.total);
  }
  // Whether evicting cached prefixes would let `budget` (the daemon's metadata budget or
  // one inside it) take `bytes` it cannot take now: only the daemon's budget is short,
  // and the arena's cached prefixes hold what it lacks. REQUIRES: no pool lock held.
  bool CanReclaimMetadata(const ByteBudget* budget, size_t bytes) const {
    for (const ByteBudget* b = budget; b != nullptr && b != &metadata; b = b->parent()) {
      if (bytes > b->limit() - b->used()) return false;
    }
    const size_t room = metadata.available();
    return bytes > room && bytes - room <= pools.FreeableMetadataBytes();
  }
  // When CanReclaimMetadata: evicts cached prefixes (the arena's least recently cached
  // pages) until the daemon's budget has `bytes` free; whether it has. Nothing is evicted
  // otherwise, so a request refused for metadata changes nothing. REQUIRES: no pool lock held.
  bool ReclaimMetadata(const ByteBudget* budget, size_t bytes) {
    if (!CanReclaimMetadata(budget, bytes)) return false;
    return pools.ReclaimMetadata([this, bytes] { return metadata.available() >= bytes; });
  }
  // Evicts cached prefixes until they keep at most cached_metadata_limit.
  // REQUIRES: no pool lock held.
  void TrimCachedMetadata() {
    auto within = [this] {
      return pool_counters.cached_metadata.load(std::memory_order_relaxed) <= cached_metadata_limit;
    };
    if (!within()) pools.ReclaimMetadata(within);
  }
  // The quota of owner's caches allocated without a session (an owner StoreOptions::owners
  // does not list shares the one of "").
  std::shared_ptr<Quota> SessionlessOf(const std::string& owner) const {
    auto it = owners.find(owner);
    return it == owners.end() ? sessionless : it->second.sessionless;
  }
  // The metadata charge of a new cache of `quota`'s session (KvCache::FixedMetadataBytes;
  // a generated id counted at its longest), in two steps so that cached prefixes give
  // metadata back only for a request that passed its other checks: Begin charges it when
  // it fits, or, when it does not but cached prefixes could give back what the request
  // will charge in all (this and `later_bytes`: the tokens the cache will declare), leaves
  // it to Finish, which reclaims and charges. RESOURCE_EXHAUSTED naming the budget
  // (metadata_bytes, the tenant's max_metadata_bytes or session_metadata_bytes) otherwise.
  struct CacheMetadata {
    BudgetCharge charge;
    size_t bytes = 0;
    size_t reclaim = 0;  // what Finish must make room for first; 0: charged
  };
  absl::StatusOr<CacheMetadata> BeginCacheMetadata(absl::string_view op, const CacheSpec& spec,
                                                   const std::string& cache_id, Quota* quota,
                                                   size_t later_bytes);
  absl::StatusOr<BudgetCharge> FinishCacheMetadata(absl::string_view op, const CacheSpec& spec,
                                                   CacheMetadata m);
  // Reap's idle_ttl step: moves the sessionless caches idle past idle_ttl at `now` out of
  // the maps into *gone (not yet released). Walks every cache only when one may have
  // expired: not before next_idle_scan.
  void TakeIdle(absl::Time now, std::vector<std::shared_ptr<KvCache>>* gone);
  // The caches a Reserve / Commit lists, each at most once and each the session's.
  absl::StatusOr<std::vector<std::shared_ptr<KvCache>>> FindAll(
      absl::string_view op, const std::string& session,
      const std::vector<CacheTokens>& items) const;
  // The session's scratch region, created and charged to the budget on its first call
  // (RESOURCE_EXHAUSTED when the budget cannot cover it).
  absl::StatusOr<std::shared_ptr<const Region>> CreateScratch(
      const std::string& session, const SessionTable::ScratchView& scratch);
  void RegionsChanged() const {
    if (options.on_regions_changed) options.on_regions_changed();
  }

  const StoreOptions options;
  const std::unique_ptr<Backend> backend;
  const std::unique_ptr<Backend> scratch_backend;  // host memory, whatever the pools use
  std::atomic<uint64_t> next_scratch{0};
  ArenaBudget budget;
  ByteBudget metadata;  // --metadata_bytes
  const std::shared_ptr<KvKernels> kernels;
  const RequestLimits limits;
  Clock* const clock;
  StoreCounters counters;
  PrefixEventLog events;  // before the pools: a pool destroyed last still records into it
  PoolCounters pool_counters;
  SessionTable sessions;
  // Each owner StoreOptions::owners lists: its bounds, and its sessionless caches' quota
  // inside them. Built at construction, read-only after.
  struct OwnerQuotas {
    std::shared_ptr<Quota> total;
    std::shared_ptr<Quota> sessionless;
  };
  static std::map<std::string, OwnerQuotas> OwnersOf(const StoreOptions& o, ByteBudget* metadata) {
    std::map<std::string, OwnerQuotas> out;
    for (const auto& [owner, bounds] : o.owners) {
      const size_t share = bounds.max_metadata_bytes != 0 ? bounds.max_metadata_bytes
                                                          : o.metadata_bytes / o.owners.size();
      out[owner].total = Quota::ForOwner(owner, bounds.max_caches, bounds.max_pages,
                                         std::max<size_t>(share, 1), metadata);
    }
    for (auto& [owner, q] : out) {
      q.sessionless =
          std::make_shared<Quota>(o.max_caches_per_session, o.session_max_pages,
                                  o.session_metadata_bytes, q.total->metadata(), q.total);
    }
    return out;
  }
  // What cached prefixes may keep of the metadata budget (StoreOptions::cached_metadata_bytes).
  const size_t cached_metadata_limit;
  const std::map<std::string, OwnerQuotas> owners;
  const std::shared_ptr<Quota> sessionless;  // the caches allocated without a session or owner
  PoolSet pools;  // changed only under mu (see above); destroyed before events

  mutable absl::Mutex mu;
  absl::flat_hash_map<std::string, std::shared_ptr<KvCache>> caches ABSL_GUARDED_BY(mu);
  // The same caches' ids in order (views of each cache's own id, which lives as long as
  // the map holds the cache), so a ListCaches page costs O(log caches + page), not a walk.
  // Changed only with `caches`, through AddLocked / EraseLocked.
  absl::btree_set<absl::string_view> ids ABSL_GUARDED_BY(mu);
  void AddLocked(std::shared_ptr<KvCache> cache) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ids.insert(cache->id());
    caches.emplace(cache->id(), std::move(cache));
  }
  void EraseLocked(absl::flat_hash_map<std::string, std::shared_ptr<KvCache>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ids.erase(it->second->id());  // before the map lets go of the id it views
    caches.erase(it);
  }
  // Ids of caches an Allocate is building outside the lock (counted in their pool and
  // against max_caches; nobody else can take the id or see the cache yet).
  absl::flat_hash_set<std::string> pending ABSL_GUARDED_BY(mu);
  uint64_t next_cache ABSL_GUARDED_BY(mu) = 1;
  // Unix nanoseconds before which no sessionless cache can be idle past idle_ttl (TakeIdle).
  std::atomic<int64_t> next_idle_scan{std::numeric_limits<int64_t>::min()};
};

}  // namespace kvarena

#endif  // KVARENA_CORE_KV_STORE_IMPL_H_
