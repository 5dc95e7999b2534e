// KvStore's prefix-reuse operations: SetTokens, Fork and the prefix events (the
// arena-wide reclaiming of cached pages is PoolSet::TrimOthers).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "arena/region.h"
#include "base/checked.h"
#include "base/status_macros.h"
#include "core/kv_store.h"
#include "core/kv_store_impl.h"
#include "core/refusal.h"
#include "core/validate.h"

namespace kvarena {

absl::StatusOr<CacheInfo> KvStore::SetTokens(const std::string& session,
                                             const SetTokensArgs& args) {
  KVARENA_ASSIGN_OR_RETURN(auto cache, impl_->Find(session, args.cache_id));
  return (cache)->SetTokens(args.first_pos, args.token_ids);
}

absl::StatusOr<CacheInfo> KvStore::Fork(const std::string& session, const std::string& cache_id,
                                        const std::string& new_cache_id) {
  Impl& im = *impl_;
  KVARENA_ASSIGN_OR_RETURN(auto src, im.Find(session, cache_id));
  if (new_cache_id.size() > kMaxCacheIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("fork: new_cache_id has ", new_cache_id.size(),
                                                   " bytes; at most ", kMaxCacheIdBytes));
  }
  // A sessionless caller forks a sessionless cache (Find refuses it a session's): the
  // fork joins the same owner's sessionless caches.
  std::shared_ptr<Quota> quota =
      session.empty() ? (src)->shared_quota() : im.sessions.QuotaOf(session);
  if (quota == nullptr) return im.CheckSession(session);  // detached meanwhile
  KVARENA_ASSIGN_OR_RETURN(Impl::CacheMetadata planned,
                           im.BeginCacheMetadata("fork", (src)->spec(), new_cache_id, quota.get(),
                                                 (src)->ForkMetadataBytes()));
  auto refusal = [&]() ABSL_SHARED_LOCKS_REQUIRED(im.mu) -> absl::Status {
    if (int64_t(im.caches.size() + im.pending.size()) >= im.options.max_caches) {
      return RefusedError(Refusal::kMaxCaches,
                          absl::StrCat("fork: ", im.caches.size() + im.pending.size(),
                                       " caches are alive; max_caches=", im.options.max_caches));
    }
    if (!new_cache_id.empty() &&
        (im.caches.contains(new_cache_id) || im.pending.contains(new_cache_id))) {
      return absl::AlreadyExistsError(
          absl::StrCat("fork: cache ", Quoted(new_cache_id), " already exists"));
    }
    if (!im.pools.Contains((src)->pool())) {
      return absl::NotFoundError(absl::StrCat("cache ", Quoted(cache_id), " was released"));
    }
    return absl::OkStatus();
  };
  std::shared_ptr<PagePool> pool;
  std::string id = new_cache_id;
  {
    absl::MutexLock lock(&im.mu);
    KVARENA_RETURN_IF_ERROR(refusal());
    pool = im.pools.Find((src)->pool()->id());
    if (id.empty()) {
      do id = absl::StrCat("cache-", im.next_cache++);
      while (im.caches.contains(id) || im.pending.contains(id));
    }
  }
  if (!quota->TryAddCache()) {
    return RefusedError(
        quota->CachesRefusal(),
        absl::StrCat("fork: ",
                     quota->DescribeCaches(session.empty() ? "the set of caches without a session"
                                                           : "the session")));
  }
  // Past every other check: cached prefixes may now give metadata back for this cache.
  absl::StatusOr<BudgetCharge> metadata =
      im.FinishCacheMetadata("fork", (src)->spec(), std::move(planned));
  if (!metadata.ok()) {
    quota->RemoveCache();
    return metadata.status();
  }
  // Built outside the map lock (it waits for src's lock); the cache counts in the quota
  // from here and gives everything back when dropped.
  auto cache = std::make_shared<KvCache>(id, (src)->spec(), session, im.ContextFor(pool, quota),
                                         im.clock->Now(), *std::move(metadata));
  KVARENA_RETURN_IF_ERROR(cache->ForkFrom(*src));
  {
    absl::MutexLock lock(&im.mu);
    KVARENA_RETURN_IF_ERROR(refusal());
    if (im.caches.contains(id) || im.pending.contains(id)) {
      return absl::AlreadyExistsError(absl::StrCat("fork: cache ", Quoted(id), " already exists"));
    }
    if (!session.empty()) KVARENA_RETURN_IF_ERROR(im.sessions.AddCache(session, id));
    im.pools.AddCache(pool->id());
    im.AddLocked(cache);
  }
  im.counters.forks += 1;
  return cache->Info();
}

std::vector<PrefixEvent> KvStore::PrefixEvents(uint64_t from_seq, size_t max, bool* lost) const {
  return impl_->events.ReadFrom(from_seq, max, lost);
}

uint64_t KvStore::NextPrefixEventSeq() const { return impl_->events.next_seq(); }

std::string KvStore::Medium() const { return BackendDevice(impl_->backend->name()); }

}  // namespace kvarena
