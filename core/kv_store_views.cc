// KvStore's read-only views: arena and cache stats, and the cache list (kv_store.h).
#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/kv_store.h"
#include "core/kv_store_impl.h"

namespace kvarena {

absl::StatusOr<PageStats> KvStore::CacheStats(const std::string& cache_id) const {
  KVARENA_ASSIGN_OR_RETURN(auto cache, impl_->Find("", cache_id, /*check_owner=*/false));
  return (cache)->Stats();
}

ArenaStats KvStore::Stats() const {
  ArenaStats s;
  s.backend = impl_->backend->name();
  s.arena_bytes = impl_->budget.limit();
  s.bytes_committed = impl_->budget.used();
  const SessionTable::Counts sessions = impl_->sessions.counts();
  s.num_sessions = sessions.held;
  s.sessions_in_grace = sessions.in_grace;
  s.sessions_opened = sessions.opened;
  s.sessions_detached = sessions.detached;
  s.sessions_resumed = sessions.resumed;
  s.scratch_bytes = impl_->sessions.scratch_bytes();
  s.scratch_regions = impl_->sessions.scratch_regions();
  s.metadata_bytes = impl_->metadata.limit();
  s.metadata_bytes_used = impl_->metadata.used();
  s.event_log_bytes = impl_->events.bytes();
  s.cached_metadata_bytes = impl_->pool_counters.cached_metadata.load();
  s.cached_metadata_limit = impl_->cached_metadata_limit;
  s.warm_bytes = impl_->pool_counters.warm_bytes.load();
  s.warm_limit = impl_->pool_counters.warm_limit;
  s.huge_pages = impl_->backend->huge_pages();
  {
    absl::ReaderMutexLock lock(&impl_->mu);
    s.num_caches = int64_t(impl_->caches.size());
    std::vector<PoolSet::Entry> entries = impl_->pools.List();
    s.pools.reserve(entries.size());
    for (PoolSet::Entry& e : entries) {
      PoolStats& p = s.pools.emplace_back(e.pool->Stats());
      p.num_caches = e.num_caches;
      p.owner = std::move(e.owner);
    }
  }
  PageStats& t = s.pages;
  for (const PoolStats& p : s.pools) {
    t.pages_used += p.pages_used;
    t.pages_free += p.pages_free;
    t.bytes_used += uint64_t(p.pages_used) * p.page_bytes;
    t.page_size =
        (&p == &s.pools.front() || t.page_size == p.layout.page_size) ? p.layout.page_size : 0;
  }
  t.num_pages = t.pages_used + t.pages_free;
  s.bytes_used = t.bytes_used;
  const StoreCounters& c = impl_->counters;
  t.seq_len = c.seq_len_sum.load();
  t.layers_materialized = c.layers_materialized.load();
  t.layers_total = c.layers_total.load();
  t.layers_sliding = c.layers_sliding.load();
  t.pages_evicted = c.pages_evicted.load();
  t.refusals = c.refusals.load();
  s.sessions_reaped = c.sessions_reaped.load();
  s.caches_reaped_grace = c.caches_reaped_grace.load();
  s.caches_reaped_idle = c.caches_reaped_idle.load();
  if (impl_->options.tiers) s.tiers = impl_->options.tiers->Stats();
  for (const PoolStats& p : s.pools) {
    t.pages_cached += p.pages_cached;
    t.pages_shared += p.pages_shared;
  }
  t.pages_evicted_lru = impl_->pool_counters.pages_reclaimed.load();
  t.pages_reclaimed_for_metadata = impl_->pool_counters.pages_reclaimed_for_metadata.load();
  t.prefix_lookups = c.prefix_lookups.load();
  t.prefix_requested_tokens = c.prefix_requested_tokens.load();
  t.prefix_hit_tokens = c.prefix_hit_tokens.load();
  t.forks = c.forks.load();
  t.cow_copies = c.cow_copies.load();
  return s;
}

std::vector<CacheInfo> KvStore::ListCaches() const {
  return ListCaches("", std::numeric_limits<size_t>::max()).caches;
}

KvStore::CachePage KvStore::ListCaches(const std::string& after, size_t max_caches) const {
  max_caches = std::max<size_t>(max_caches, 1);
  // The max_caches + 1 smallest ids after `after`, from the ordered ids: the one beyond
  // max_caches only says whether more remain.
  std::vector<std::shared_ptr<KvCache>> page;
  {
    absl::ReaderMutexLock lock(&impl_->mu);
    for (auto it = impl_->ids.upper_bound(after);
         it != impl_->ids.end() && page.size() <= max_caches; ++it) {
      page.push_back(impl_->caches.find(*it)->second);
    }
  }
  CachePage out;
  out.more = page.size() > max_caches;
  if (out.more) page.pop_back();
  if (!page.empty()) out.last_id = page.back()->id();
  for (const std::shared_ptr<KvCache>& c : page) {
    absl::StatusOr<CacheInfo> info = c->Info();
    if (info.ok()) out.caches.push_back(*std::move(info));
  }
  return out;
}

}  // namespace kvarena
