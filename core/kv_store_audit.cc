// KvStore's test audit: the page, index, quota and metadata accounting checked against
// what the caches hold, and the tiers' write queue (TEST_CheckInvariants), and
// everything a client could observe (TEST_DebugState).
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/checked.h"
#include "base/status_macros.h"
#include "core/kv_store.h"
#include "core/kv_store_impl.h"

namespace kvarena {

absl::Status KvStore::TEST_CheckInvariants() const {
  std::vector<std::shared_ptr<KvCache>> caches;
  std::map<uint64_t, std::shared_ptr<PagePool>> pools;
  {
    absl::ReaderMutexLock lock(&impl_->mu);
    for (const auto& [id, c] : impl_->caches) {
      if (!impl_->ids.contains(id)) {
        return absl::InternalError(
            absl::StrCat("cache ", Quoted(id), " is missing from the ordered ids"));
      }
      caches.push_back(c);
    }
    if (impl_->ids.size() != impl_->caches.size()) {
      return absl::InternalError(
          absl::StrCat(impl_->ids.size(), " ordered ids for ", impl_->caches.size(), " caches"));
    }
    for (const PoolSet::Entry& e : impl_->pools.List()) pools.emplace(e.pool->id(), e.pool);
  }
  KVARENA_RETURN_IF_ERROR(impl_->pools.TEST_Audit());
  std::map<uint64_t, absl::flat_hash_map<int32_t, int32_t>> refs;  // per pool: page -> table slots
  std::map<uint64_t, absl::flat_hash_map<uint64_t, int64_t>> holds;  // per pool: node -> holds
  struct QuotaUse {
    int64_t pages = 0, caches = 0;
    size_t metadata = 0;
  };
  std::map<Quota*, QuotaUse> per_quota;
  per_quota[impl_->sessionless.get()];   // checked even when no sessionless cache is left
  std::map<Quota*, QuotaUse> per_owner;  // what each owner's caches hold, of every quota inside it
  for (const auto& [owner, q] : impl_->owners) {
    per_quota[q.sessionless.get()];
    per_owner[q.total.get()];
  }
  size_t metadata = 0;  // what the caches and pools hold of the metadata budget
  for (const auto& c : caches) {
    const std::vector<int32_t> held = c->HeldPages();
    auto st = c->Stats();
    if (!st.ok())
      return absl::InternalError(
          absl::StrCat("cache ", Quoted(c->id()), ": ", st.status().message()));
    if (st->pages_used != int64_t(held.size())) {
      return absl::InternalError(absl::StrCat("cache ", Quoted(c->id()), " counts ", st->pages_used,
                                              " pages but its tables hold ", held.size()));
    }
    if (!pools.contains(c->pool()->id())) {
      return absl::InternalError(
          absl::StrCat("cache ", Quoted(c->id()), " draws from a dropped pool"));
    }
    std::set<int32_t> mine;
    for (int32_t id : held) {
      if (!mine.insert(id).second) {
        return absl::InternalError(absl::StrCat("page ", id, " of pool ", c->pool()->id(),
                                                " is held twice by ", Quoted(c->id())));
      }
      if (!c->pool()->TEST_IsAllocated(id)) {
        return absl::InternalError(
            absl::StrCat("page ", id, " is held by ", Quoted(c->id()), " but free"));
      }
      ++refs[c->pool()->id()][id];
    }
    size_t cache_metadata = 0;
    KVARENA_RETURN_IF_ERROR(c->TEST_Audit(&holds[c->pool()->id()], &cache_metadata));
    QuotaUse& q = per_quota[c->quota()];
    q.pages += int64_t(held.size());
    q.caches += 1;
    q.metadata += cache_metadata;
    metadata += cache_metadata;
    if (Quota* owner = c->quota()->parent(); owner != nullptr) {
      per_owner[owner].pages += int64_t(held.size());
      per_owner[owner].caches += 1;
    }
  }
  for (const auto& [id, pool] : pools) {
    if (pool->pages_used() != int64_t(refs[id].size())) {
      return absl::InternalError(absl::StrCat("pool ", id, " has ", pool->pages_used(),
                                              " pages used but caches hold ", refs[id].size()));
    }
    KVARENA_RETURN_IF_ERROR(pool->TEST_Audit(refs[id], holds[id]));
    metadata += pool->TEST_MetadataBytes();
  }
  for (const auto& [quota, use] : per_quota) {
    if (quota->pages() != use.pages || quota->caches() != use.caches ||
        quota->metadata()->used() != use.metadata) {
      return absl::InternalError(absl::StrCat(
          "a quota counts ", quota->pages(), " pages, ", quota->caches(), " caches and ",
          quota->metadata()->used(), " metadata bytes but its caches hold ", use.pages, ", number ",
          use.caches, " and charged ", use.metadata));
    }
  }
  for (const auto& [quota, use] : per_owner) {
    if (quota->pages() != use.pages || quota->caches() != use.caches) {
      return absl::InternalError(
          absl::StrCat("an owner's quota counts ", quota->pages(), " pages and ", quota->caches(),
                       " caches but its caches hold ", use.pages, " and number ", use.caches));
    }
  }
  if (impl_->metadata.used() != metadata) {
    return absl::InternalError(absl::StrCat("metadata_bytes counts ", impl_->metadata.used(),
                                            " bytes used but caches and pools hold ", metadata));
  }
  if (const TierSet* tiers = impl_->options.tiers.get(); tiers != nullptr)
    return tiers->TEST_Audit();
  return absl::OkStatus();
}

std::string KvStore::TEST_DebugState() const {
  const ArenaStats s = Stats();
  std::string out = absl::StrCat("pages used=", s.pages.pages_used, " free=", s.pages.pages_free,
                                 " seq=", s.pages.seq_len, " evicted=", s.pages.pages_evicted,
                                 " cached=", s.pages.pages_cached, " shared=", s.pages.pages_shared,
                                 " committed=", s.bytes_committed, " caches=", s.num_caches,
                                 " pools=", s.pools.size(), " sessions=", s.num_sessions, "\n");
  std::map<std::string, std::shared_ptr<KvCache>> caches;
  {
    absl::ReaderMutexLock lock(&impl_->mu);
    for (const auto& [id, c] : impl_->caches) caches.emplace(id, c);
  }
  for (const auto& [id, c] : caches) absl::StrAppend(&out, c->DebugState(), "\n");
  return out;
}

const Region* KvStore::TEST_PoolRegion(uint64_t pool_id) const {
  std::shared_ptr<PagePool> pool = impl_->pools.Find(pool_id);
  return pool == nullptr ? nullptr : &pool->region();
}

}  // namespace kvarena
