// The state behind KvStore, shared by its implementation files (kv_store.cc: caches and
// pools; kv_store_sessions.cc; kv_store_views.cc: stats, the cache list;
// kv_store_local.cc: the local path; kv_store_prefix.cc: SetTokens, Fork, trimming;
// kv_store_regions.cc: sharing; kv_store_audit.cc: the TEST_ audit).
// Internal to core/.
//
// Thread-safety: as KvStore; `mu` guards the maps, each cache and pool locks itself.
// Pools are shared with the caches drawn from them: a pool leaves the maps when its last
// cache is released and is destroyed (its memory given back) when the last cache object
// referring to it goes.
#ifndef KVARENA_CORE_KV_STORE_IMPL_H_
#define KVARENA_CORE_KV_STORE_IMPL_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/kv_cache.h"
#include "core/kv_store.h"
#include "core/page_pool.h"
#include "core/quota.h"
#include "core/session_table.h"
#include "core/validate.h"
#include "kernels/kv_kernels.h"

namespace kvarena {

// A pool per owner (tenant; "" without tenants) and geometry: two owners never share a
// pool, so a session maps only its own owner's pages.
struct PoolKey {
  std::string owner;
  int dtype = 0;
  int page_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  friend bool operator<(const PoolKey& a, const PoolKey& b) {
    return std::tie(a.owner, a.dtype, a.page_size, a.num_kv_heads, a.head_dim) <
           std::tie(b.owner, b.dtype, b.page_size, b.num_kv_heads, b.head_dim);
  }
  friend bool operator==(const PoolKey& a, const PoolKey& b) { return !(a < b) && !(b < a); }
};

struct KvStore::Impl {
  Impl(const StoreOptions& o, std::unique_ptr<Backend> b)
      : options(o),
        backend(std::move(b)),
        scratch_backend(NewHostBackend()),
        budget(o.arena_bytes),
        metadata(o.metadata_bytes, nullptr, "metadata_bytes"),
        kernels(o.kernels ? o.kernels : std::shared_ptr<KvKernels>(NewCpuKvKernels(o.num_threads))),
        limits(LimitsOf(kernels->limits(), o)),
        clock(o.clock ? o.clock : RealClock()),
        events(o.prefix_event_capacity, o.prefix_event_bytes),
        sessions(o.max_sessions, o.max_sessions_per_peer),
        owners(OwnersOf(o, &metadata)),
        sessionless(NewQuota("")) {
    pool_counters.events = &events;
    pool_counters.metadata = &metadata;
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
  // owner's pool for a resolved spec, created when new (*created set).
  absl::StatusOr<std::shared_ptr<PagePool>> PoolFor(const CacheSpec& spec, const std::string& owner,
                                                    bool* created)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The key `pool` is filed under (REQUIRES: it is in the maps).
  PoolKey KeyOfLocked(const PagePool& pool) const ABSL_SHARED_LOCKS_REQUIRED(mu);
  // Whether a caller of `owner` may see and map pool `id` (REQUIRES: it is in the maps).
  bool PoolOwnedByLocked(uint64_t id, const std::string& owner) const
      ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return pool_owner.at(id) == owner;
  }
  // Drops `pool` from the maps when no cache is drawn from it any more; returns whether it did.
  bool DropPoolIfUnusedLocked(const PagePool* pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Takes cache out of the maps (REQUIRES: it is there) and releases its pages; tells
  // workers when that emptied a pool.
  void Remove(const std::shared_ptr<KvCache>& cache);
  // Drops every pool no cache draws from and that caches no page; returns how many.
  int DropIdlePoolsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // When `pool` lacks budget for n pages: reclaims cached pages of the other pools until
  // that much went back — only if they can give it all, so a refusal changes nothing.
  // True when it freed the shortfall. Takes no store lock (pools_mu only): callers hold
  // caches' locks.
  bool TrimOtherPools(const PagePool* pool, int64_t n);
  // pool->Allocate, retried once after TrimOtherPools when the arena is full.
  absl::Status AllocatePages(PagePool* pool, int64_t n, std::vector<int32_t>* ids,
                             std::vector<int32_t>* committed);
  CacheContext ContextFor(std::shared_ptr<PagePool> pool, std::shared_ptr<Quota> quota);
  // A quota of owner's: a session's (the sessionless caches share one per owner), its
  // metadata inside `metadata`, inside the owner's quota when StoreOptions::owners lists it.
  std::shared_ptr<Quota> NewQuota(const std::string& owner) {
    auto it = owners.find(owner);
    return std::make_shared<Quota>(options.max_caches_per_session, options.session_max_pages,
                                   options.session_metadata_bytes, &metadata,
                                   it == owners.end() ? nullptr : it->second.total);
  }
  // The quota of owner's caches allocated without a session (an owner StoreOptions::owners
  // does not list shares the one of "").
  std::shared_ptr<Quota> SessionlessOf(const std::string& owner) const {
    auto it = owners.find(owner);
    return it == owners.end() ? sessionless : it->second.sessionless;
  }
  // The metadata charge of a new cache of `quota`'s session (KvCache::FixedMetadataBytes;
  // a generated id counted at its longest); RESOURCE_EXHAUSTED naming the budget
  // (metadata_bytes or session_metadata_bytes) when it does not fit.
  absl::StatusOr<BudgetCharge> ChargeCacheMetadata(absl::string_view op, const CacheSpec& spec,
                                                   const std::string& cache_id, Quota* quota);
  // The caches a Reserve / Commit lists, each at most once and each the session's.
  absl::StatusOr<std::vector<std::shared_ptr<KvCache>>> FindAll(
      absl::string_view op, const std::string& session, const std::vector<CacheTokens>& items) const;
  // The session's scratch region, created and charged to the budget on its first call
  // (RESOURCE_EXHAUSTED when the budget cannot cover it).
  absl::StatusOr<std::shared_ptr<const Region>> CreateScratch(const std::string& session,
                                                              const SessionTable::ScratchView& scratch);
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
      out[owner].total = Quota::ForOwner(owner, bounds.max_caches, bounds.max_pages);
    }
    for (auto& [owner, q] : out) {
      q.sessionless = std::make_shared<Quota>(o.max_caches_per_session, o.session_max_pages,
                                              o.session_metadata_bytes, metadata, q.total);
    }
    return out;
  }
  const std::map<std::string, OwnerQuotas> owners;
  const std::shared_ptr<Quota> sessionless;  // the caches allocated without a session or owner

  mutable absl::Mutex mu;
  std::map<PoolKey, std::shared_ptr<PagePool>> pools ABSL_GUARDED_BY(mu);
  std::map<uint64_t, std::shared_ptr<PagePool>> pools_by_id ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint64_t, std::string> pool_owner ABSL_GUARDED_BY(mu);  // PoolKey::owner
  uint64_t next_pool_id ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<std::string, std::shared_ptr<KvCache>> caches ABSL_GUARDED_BY(mu);
  // Ids of caches an Allocate is building outside the lock (counted in caches_per_pool
  // and against max_caches; nobody else can take the id or see the cache yet).
  absl::flat_hash_set<std::string> pending ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint64_t, int64_t> caches_per_pool ABSL_GUARDED_BY(mu);
  uint64_t next_cache ABSL_GUARDED_BY(mu) = 1;

  // The pools again, for TrimOtherPools, which runs under cache locks (so cannot take mu).
  // Lock order: mu -> pools_mu; nothing is locked while pools_mu is held.
  mutable absl::Mutex pools_mu ABSL_ACQUIRED_AFTER(mu);
  std::vector<std::shared_ptr<PagePool>> live_pools ABSL_GUARDED_BY(pools_mu);
};

}  // namespace kvarena

#endif  // KVARENA_CORE_KV_STORE_IMPL_H_
