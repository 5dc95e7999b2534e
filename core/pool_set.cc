#include "core/pool_set.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/refusal.h"
#include "kvarena/paged_kv.h"

namespace kvarena {

PoolSet::PoolSet(Backend* backend, ArenaBudget* budget, int max_pools, int empty_chunks_kept,
                 PoolCounters* counters)
    : backend_(backend),
      budget_(budget),
      max_pools_(max_pools),
      empty_chunks_kept_(empty_chunks_kept),
      counters_(counters) {}

int64_t PoolSet::CachesLocked(uint64_t id) const {
  auto n = caches_.find(id);
  return n == caches_.end() ? 0 : n->second;
}

PoolKey PoolSet::KeyOfLocked(uint64_t id) const {
  return PoolKey(owner_.at(id), by_id_.at(id)->layout());
}

std::shared_ptr<PagePool> PoolSet::EraseLocked(uint64_t id) {
  by_key_.erase(KeyOfLocked(id));
  caches_.erase(id);
  owner_.erase(id);
  auto it = by_id_.find(id);
  std::shared_ptr<PagePool> pool = std::move(it->second);
  by_id_.erase(it);
  return pool;
}

absl::StatusOr<std::shared_ptr<PagePool>> PoolSet::PoolFor(const CacheSpec& spec,
                                                           const std::string& owner, bool* created,
                                                           std::shared_ptr<PagePool>* displaced) {
  *created = false;
  const PageLayout layout = LayoutOf(spec);
  const PoolKey key(owner, layout);
  std::shared_ptr<PagePool> gave_way;  // destroyed after the lock, unless handed out
  absl::MutexLock lock(&mu_);
  auto it = by_key_.find(key);
  if (it != by_key_.end()) return it->second;
  if (int64_t(by_key_.size()) >= max_pools_) {
    // A pool kept only for its cached pages gives way to a geometry in use.
    for (const auto& [id, p] : by_id_) {
      if (CachesLocked(id) > 0) continue;
      gave_way = EraseLocked(id);
      if (displaced != nullptr) *displaced = std::move(gave_way);
      break;
    }
  }
  if (int64_t(by_key_.size()) >= max_pools_) {
    return RefusedError(Refusal::kMaxPools,
                        absl::StrCat("allocate: ", by_key_.size(),
                                     " pools (distinct geometries) are alive; max_pools=",
                                     max_pools_, " (a pool goes when its last cache is released)"));
  }
  const uint64_t id = next_id_;
  absl::StatusOr<std::unique_ptr<PagePool>> pool =
      PagePool::Create(id, layout, backend_, budget_, empty_chunks_kept_, counters_, owner);
  if (!pool.ok()) return Annotated(pool.status(), "allocate: ");
  ++next_id_;
  std::shared_ptr<PagePool> p = *std::move(pool);
  by_key_.emplace(key, p);
  by_id_.emplace(id, p);
  owner_.emplace(id, owner);
  *created = true;
  return p;
}

std::shared_ptr<PagePool> PoolSet::Find(uint64_t id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

std::shared_ptr<PagePool> PoolSet::Find(uint64_t id, const std::string& owner) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() || owner_.at(id) != owner ? nullptr : it->second;
}

bool PoolSet::Contains(const PagePool* pool) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = by_id_.find(pool->id());
  return it != by_id_.end() && it->second.get() == pool;
}

void PoolSet::AddCache(uint64_t id) {
  absl::MutexLock lock(&mu_);
  ++caches_[id];
}

void PoolSet::RemoveCache(uint64_t id) {
  absl::MutexLock lock(&mu_);
  --caches_[id];
}

bool PoolSet::DropIfUnused(const PagePool* pool) {
  absl::MutexLock lock(&mu_);
  return DropIfUnusedLocked(pool);
}

bool PoolSet::DropIfUnusedLocked(const PagePool* pool) {
  auto it = by_id_.find(pool->id());
  if (it == by_id_.end() || it->second.get() != pool) return false;
  if (CachesLocked(pool->id()) > 0) return false;
  // Cached pages keep an idle pool, for the next cache of its geometry to adopt them; they
  // give way to other pools' allocations (TrimOthers) and to new geometries (PoolFor).
  if (pool->pages_cached() > 0) return false;
  // So do warm chunks, under an arena that keeps some (PoolCounters::warm_limit): the next
  // cache of the geometry writes pages already faulted in.
  if (counters_ != nullptr && counters_->warm_limit > 0 && pool->empty_bytes() > 0) return false;
  EraseLocked(pool->id());
  return true;
}

int PoolSet::DropIdle() {
  absl::MutexLock lock(&mu_);
  std::vector<const PagePool*> idle;
  for (const auto& [id, p] : by_id_) {
    if (CachesLocked(id) == 0) idle.push_back(p.get());
  }
  int dropped = 0;
  for (const PagePool* p : idle) dropped += DropIfUnusedLocked(p);
  return dropped;
}

bool PoolSet::TrimOthers(const PagePool* pool, int64_t n) {
  const size_t shortfall = pool->BudgetShortfall(n);
  if (shortfall == 0) return false;
  const std::pair<PagePool*, int64_t> keep[] = {{const_cast<PagePool*>(pool), n}};
  return TrimAllBut(keep, shortfall);
}

std::vector<std::shared_ptr<PagePool>> PoolSet::AllBut(
    absl::Span<const std::pair<PagePool*, int64_t>> keep) const {
  std::vector<std::shared_ptr<PagePool>> others;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& entry : by_id_) {
    const PagePool* p = entry.second.get();
    if (std::none_of(keep.begin(), keep.end(), [p](const auto& k) { return k.first == p; }))
      others.push_back(entry.second);
  }
  return others;
}

namespace {

// Takes `bytes` back from pools, all or nothing: only when their `can` sum to that much,
// then `take` from each in turn until it came back. Whether it did.
template <typename Can, typename Take>
bool TakeBack(const std::vector<std::shared_ptr<PagePool>>& pools, size_t bytes, Can can,
              Take take) {
  size_t available = 0;
  for (const auto& p : pools) available += can(*p);
  if (available < bytes) return false;
  size_t freed = 0;
  for (const auto& p : pools) {
    if (freed < bytes) freed += take(*p, bytes - freed);
  }
  return freed >= bytes;
}

}  // namespace

bool PoolSet::TrimAllBut(absl::Span<const std::pair<PagePool*, int64_t>> keep, size_t bytes) {
  return TakeBack(
      AllBut(keep), bytes, [](const PagePool& p) { return p.ReclaimableBytes(); },
      [](PagePool& p, size_t n) { return p.TrimCached(n); });
}

bool PoolSet::TrimEmpty(size_t bytes) {
  return TakeBack(
      AllBut({}), bytes, [](const PagePool& p) { return p.empty_bytes(); },
      [](PagePool& p, size_t n) { return p.TrimEmpty(n); });
}

absl::Status PoolSet::AllocateTogether(absl::Span<const std::pair<PagePool*, int64_t>> needs,
                                       PoolPages* ids, PoolPages* committed) {
  if (needs.empty()) return absl::OkStatus();
  // The plan: each pool commits at least the chunks its free and cached pages leave
  // missing, then, while the budget lasts, the chunks that spare its cached pages (as
  // Allocate prefers); what the budget lacks comes from the other pools' cached pages.
  const ArenaBudget& budget = needs.front().first->budget();
  for (const auto& [pool, n] : needs) {
    // Pools of one owner share a budget; pools of several (no call has them) one by one.
    if (&pool->budget() == &budget) continue;
    for (const auto& [p, k] : needs)
      KVARENA_RETURN_IF_ERROR(Allocate(p, k, &(*ids)[p], &(*committed)[p]));
    return absl::OkStatus();
  }
  const size_t available = budget.available();
  size_t reclaimable = 0;
  for (const auto& p : AllBut(needs)) reclaimable += p->ReclaimableBytes();
  std::vector<PagePool::Supply> supply;
  std::vector<int64_t> chunks(needs.size()), wanted(needs.size());
  size_t bytes = 0;
  for (size_t i = 0; i < needs.size(); ++i) {
    supply.push_back(needs[i].first->supply());
    const PagePool::Supply& s = supply.back();
    const int64_t missing = std::max<int64_t>(0, needs[i].second - s.free_pages);
    wanted[i] = std::min(CeilDiv(missing, s.pages_per_chunk), s.uncommitted_chunks);
    chunks[i] = CeilDiv(std::max<int64_t>(0, missing - s.cached_pages), s.pages_per_chunk);
    if (chunks[i] > s.uncommitted_chunks) {
      // One pool alone cannot: its own Allocate refuses, changing nothing, naming its
      // numbers.
      return needs[i].first->Allocate(needs[i].second, &(*ids)[needs[i].first],
                                      &(*committed)[needs[i].first]);
    }
    bytes += size_t(chunks[i]) * s.chunk_bytes;
  }
  if (bytes > available + reclaimable) {
    return RefusedError(
        Refusal::kArenaFull,
        absl::StrCat("arena full: the call's ", needs.size(), " pools need ", bytes,
                     " bytes of new chunks together but ", available,
                     " of arena_bytes=", budget.limit(),
                     " are uncommitted and other pools' cached pages hold ", reclaimable));
  }
  for (size_t i = 0; i < needs.size(); ++i) {
    const size_t spare = available > bytes ? available - bytes : 0;
    const int64_t more =
        std::min<int64_t>(wanted[i] - chunks[i], int64_t(spare / supply[i].chunk_bytes));
    if (more <= 0) continue;
    chunks[i] += more;
    bytes += size_t(more) * supply[i].chunk_bytes;
  }
  if (bytes > available && !TrimAllBut(needs, bytes - available)) {
    return RefusedError(Refusal::kArenaFull,
                        absl::StrCat("arena full: other pools' cached pages could not give ",
                                     bytes - available, " bytes back"));
  }
  for (size_t i = 0; i < needs.size(); ++i) {
    PagePool* pool = needs[i].first;
    KVARENA_RETURN_IF_ERROR(
        AllocateIn(pool, needs[i].second, &(*ids)[pool], &(*committed)[pool], chunks[i]));
  }
  return absl::OkStatus();
}

absl::Status PoolSet::Allocate(PagePool* pool, int64_t n, std::vector<int32_t>* ids,
                               std::vector<int32_t>* committed) {
  absl::Status s = pool->Allocate(n, ids, committed);
  if (absl::IsResourceExhausted(s) && TrimOthers(pool, n)) {
    s = pool->Allocate(n, ids, committed);
  }
  return RetryForMetadata(std::move(s), pool, n, ids, committed, PagePool::kAnyChunks);
}

absl::Status PoolSet::AllocateIn(PagePool* pool, int64_t n, std::vector<int32_t>* ids,
                                 std::vector<int32_t>* committed, int64_t max_new_chunks) {
  return RetryForMetadata(pool->Allocate(n, ids, committed, max_new_chunks), pool, n, ids,
                          committed, max_new_chunks);
}

absl::Status PoolSet::RetryForMetadata(absl::Status s, PagePool* pool, int64_t n,
                                       std::vector<int32_t>* ids, std::vector<int32_t>* committed,
                                       int64_t max_new_chunks) {
  if (RefusalOf(s) == Refusal::kMetadataBytes && counters_ != nullptr &&
      counters_->metadata != nullptr) {
    // The bookkeeping of every chunk n pages could need: enough room for that, or no
    // cached page left to give it.
    const size_t need = pool->MetadataBytesFor(n);
    const ByteBudget* m = counters_->metadata;
    if (m->available() < need && m->available() + FreeableMetadataBytes() >= need &&
        ReclaimMetadata([m, need] { return m->available() >= need; })) {
      s = pool->Allocate(n, ids, committed, max_new_chunks);
    }
  }
  return s;
}

size_t PoolSet::FreeableMetadataBytes() const {
  std::vector<std::shared_ptr<PagePool>> pools;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [id, p] : by_id_) pools.push_back(p);
  }
  size_t bytes = 0;
  for (const auto& p : pools) bytes += p->FreeableMetadataBytes();
  return bytes;
}

bool PoolSet::ReclaimMetadata(const std::function<bool()>& done) {
  // Pages per hold of a pool's lock, so other callers of the pool wait a bounded time.
  constexpr int64_t kBatch = 4096;
  while (!done()) {
    std::vector<std::shared_ptr<PagePool>> pools;
    {
      absl::ReaderMutexLock lock(&mu_);
      for (const auto& [id, p] : by_id_) pools.push_back(p);
    }
    // The pool holding the oldest cached page evicts until its oldest is younger than
    // the next pool's.
    PagePool* oldest = nullptr;
    uint64_t first = PageCache::kNoStamp, second = PageCache::kNoStamp;
    for (const auto& p : pools) {
      const uint64_t stamp = p->OldestCachedStamp();
      if (stamp < first) {
        second = first;
        first = stamp;
        oldest = p.get();
      } else if (stamp < second) {
        second = stamp;
      }
    }
    if (oldest == nullptr) return false;
    // Past `second` too when it is the only pool left caching: kNoStamp bounds nothing.
    oldest->EvictCachedBefore(second == PageCache::kNoStamp ? second : second + 1, done, kBatch);
  }
  return true;
}

std::vector<PoolSet::Entry> PoolSet::List() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<Entry> out;
  out.reserve(by_id_.size());
  for (const auto& [id, p] : by_id_) out.push_back(Entry{p, owner_.at(id), CachesLocked(id)});
  return out;
}

size_t PoolSet::size() const {
  absl::ReaderMutexLock lock(&mu_);
  return by_id_.size();
}

absl::Status PoolSet::TEST_Audit() const {
  absl::ReaderMutexLock lock(&mu_);
  if (by_key_.size() != by_id_.size() || owner_.size() != by_id_.size()) {
    return absl::InternalError(absl::StrCat(by_key_.size(), " pools by key and ", owner_.size(),
                                            " owners but ", by_id_.size(), " pools by id"));
  }
  for (const auto& [id, p] : by_id_) {
    if (!owner_.contains(id))
      return absl::InternalError(absl::StrCat("pool ", id, " has no owner"));
    auto k = by_key_.find(KeyOfLocked(id));
    if (k == by_key_.end() || k->second != p) {
      return absl::InternalError(absl::StrCat("pool ", id, " is not filed under its key"));
    }
  }
  for (const auto& [id, n] : caches_) {
    if (n < 0 || (n > 0 && !by_id_.contains(id))) {
      return absl::InternalError(absl::StrCat("pool ", id, " counts ", n, " caches"));
    }
  }
  return absl::OkStatus();
}

void PoolSet::Clear() {
  std::map<PoolKey, std::shared_ptr<PagePool>> by_key;
  std::map<uint64_t, std::shared_ptr<PagePool>> by_id;
  {
    absl::MutexLock lock(&mu_);
    by_key.swap(by_key_);
    by_id.swap(by_id_);
    caches_.clear();
    owner_.clear();
  }
  // The pools go here, with no lock of the set held.
}

}  // namespace kvarena
