#include "core/kv_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/kv_store_impl.h"
#include "core/validate.h"

namespace kvarena {
namespace {
constexpr size_t kMaxCacheIdBytes = 256;
}  // namespace

absl::Status KvStore::Impl::CheckSession(const std::string& session) const {
  if (session.empty() || sessions.Contains(session)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "session is unknown or detached: Attach again before using it");
}

absl::StatusOr<std::shared_ptr<KvCache>> KvStore::Impl::Find(const std::string& session,
                                                             const std::string& id,
                                                             bool check_owner) const {
  if (check_owner) {
    if (absl::Status s = CheckSession(session); !s.ok()) return s;
  }
  std::shared_ptr<KvCache> cache;
  {
    absl::ReaderMutexLock lock(&mu);
    auto it = caches.find(id);
    if (it == caches.end()) return absl::NotFoundError(absl::StrCat("cache '", id, "' not found"));
    cache = it->second;
  }
  if (check_owner && !cache->owner().empty() && cache->owner() != session) {
    return absl::PermissionDeniedError(
        absl::StrCat("cache '", id, "' belongs to another session"));
  }
  return cache;
}

absl::StatusOr<PagePool*> KvStore::Impl::PoolFor(const CacheSpec& spec) {
  const PoolKey key{int(spec.dtype), spec.page_size, spec.num_kv_heads, spec.head_dim};
  auto it = pools.find(key);
  if (it != pools.end()) return it->second.get();
  PageLayout layout{spec.dtype, spec.page_size, spec.num_kv_heads, spec.head_dim};
  auto pool = PagePool::Create(pools_by_id.size(), layout, backend.get(), &budget,
                               options.empty_chunks_kept);
  if (!pool.ok()) return pool.status();
  PagePool* p = pool->get();
  pools.emplace(key, *std::move(pool));
  pools_by_id.push_back(p);
  return p;
}

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::Create(const StoreOptions& options,
                                                         std::unique_ptr<Backend> backend) {
  if (options.arena_bytes < kChunkGranularity) {
    return absl::InvalidArgumentError(absl::StrCat("arena_bytes=", options.arena_bytes,
                                                   " is below one chunk (", kChunkGranularity, ")"));
  }
  if (options.default_page_size < 1 || options.default_page_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size=", options.default_page_size, " must be in [1, 4096]"));
  }
  return std::unique_ptr<KvStore>(new KvStore(std::make_unique<Impl>(options, std::move(backend))));
}

KvStore::KvStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvStore::~KvStore() {
  // Caches return their pages before the pools go.
  absl::MutexLock lock(&impl_->mu);
  impl_->caches.clear();
}

absl::StatusOr<CacheInfo> KvStore::Allocate(const std::string& session, const CacheSpec& spec,
                                            const std::string& cache_id) {
  if (absl::Status s = impl_->CheckSession(session); !s.ok()) return s;
  absl::StatusOr<CacheSpec> resolved = ResolveSpec(spec, impl_->options.default_page_size);
  if (!resolved.ok()) return resolved.status();
  if (absl::Status s = impl_->kernels->CheckLayout(PageLayout{resolved->dtype, resolved->page_size,
                                                              resolved->num_kv_heads, resolved->head_dim});
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("allocate: ", s.message()));
  }
  if (cache_id.size() > kMaxCacheIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("allocate: cache_id has ", cache_id.size(),
                                                   " bytes; at most ", kMaxCacheIdBytes));
  }
  absl::MutexLock lock(&impl_->mu);
  std::string id = cache_id;
  if (id.empty()) {
    do id = absl::StrCat("cache-", impl_->next_cache++);
    while (impl_->caches.contains(id));
  } else if (impl_->caches.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("allocate: cache '", id, "' already exists"));
  }
  absl::StatusOr<PagePool*> pool = impl_->PoolFor(*resolved);
  if (!pool.ok()) return pool.status();
  if (!session.empty() && !impl_->sessions.AddCache(session, id)) {
    return absl::FailedPreconditionError("allocate: the session detached while allocating");
  }
  auto cache = std::make_shared<KvCache>(id, *std::move(resolved), session, *pool,
                                         impl_->kernels.get(), &impl_->counters);
  ++impl_->caches_per_pool[(*pool)->id()];
  impl_->caches.emplace(id, cache);
  return cache->Info();
}

absl::StatusOr<AppendResult> KvStore::Append(const std::string& session, const std::string& cache_id,
                                             int layer, int64_t pos, const TensorArg& k,
                                             const TensorArg& v) {
  auto cache = impl_->Find(session, cache_id);
  if (!cache.ok()) return cache.status();
  return (*cache)->Append(layer, pos, k, v);
}

absl::StatusOr<AttendResult> KvStore::Attend(const std::string& session, const AttendArgs& args,
                                             void* out, size_t out_bytes) {
  auto cache = impl_->Find(session, args.cache_id);
  if (!cache.ok()) return cache.status();
  return (*cache)->Attend(args, out, out_bytes);
}

absl::StatusOr<PopnResult> KvStore::Popn(const std::string& session, const std::string& cache_id,
                                         int64_t n) {
  auto cache = impl_->Find(session, cache_id);
  if (!cache.ok()) return cache.status();
  return (*cache)->Popn(n);
}

absl::StatusOr<CacheInfo> KvStore::Reset(const std::string& session, const std::string& cache_id,
                                         bool keep_pages) {
  auto cache = impl_->Find(session, cache_id);
  if (!cache.ok()) return cache.status();
  return (*cache)->Reset(keep_pages);
}

absl::Status KvStore::Release(const std::string& session, const std::string& cache_id) {
  auto cache = impl_->Find(session, cache_id);
  if (!cache.ok()) return cache.status();
  {
    absl::MutexLock lock(&impl_->mu);
    auto it = impl_->caches.find(cache_id);
    if (it == impl_->caches.end() || it->second != *cache) {
      return absl::NotFoundError(absl::StrCat("cache '", cache_id, "' not found"));
    }
    impl_->caches.erase(it);
    --impl_->caches_per_pool[(*cache)->pool()->id()];
  }
  (*cache)->Release();
  if (!(*cache)->owner().empty()) impl_->sessions.RemoveCache((*cache)->owner(), cache_id);
  return absl::OkStatus();
}

absl::StatusOr<GetKvResult> KvStore::GetKv(const std::string& session, const std::string& cache_id,
                                           int layer) {
  auto cache = impl_->Find(session, cache_id);
  if (!cache.ok()) return cache.status();
  return (*cache)->GetKv(layer);
}

absl::StatusOr<CacheDescription> KvStore::Describe(const std::string& session,
                                                   const std::string& cache_id) {
  auto cache = impl_->Find(session, cache_id);
  if (!cache.ok()) return cache.status();
  return (*cache)->Describe();
}

absl::StatusOr<PageStats> KvStore::CacheStats(const std::string& cache_id) const {
  auto cache = impl_->Find("", cache_id, /*check_owner=*/false);
  if (!cache.ok()) return cache.status();
  return (*cache)->Stats();
}

ArenaStats KvStore::Stats() const {
  ArenaStats s;
  s.backend = impl_->backend->name();
  s.arena_bytes = impl_->budget.limit();
  s.bytes_committed = impl_->budget.used();
  s.num_sessions = impl_->sessions.size();
  std::vector<PagePool*> pools;
  {
    absl::ReaderMutexLock lock(&impl_->mu);
    pools = impl_->pools_by_id;
    s.num_caches = int64_t(impl_->caches.size());
    for (PagePool* p : pools) {
      s.pools.push_back(p->Stats());
      auto it = impl_->caches_per_pool.find(p->id());
      s.pools.back().num_caches = it == impl_->caches_per_pool.end() ? 0 : it->second;
    }
  }
  PageStats& t = s.pages;
  for (const PoolStats& p : s.pools) {
    t.pages_used += p.pages_used;
    t.pages_free += p.pages_free;
    t.bytes_used += uint64_t(p.pages_used) * p.page_bytes;
    t.page_size = (&p == &s.pools.front() || t.page_size == p.layout.page_size) ? p.layout.page_size : 0;
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
  return s;
}

std::vector<CacheInfo> KvStore::ListCaches() const {
  std::vector<std::shared_ptr<KvCache>> caches;
  {
    absl::ReaderMutexLock lock(&impl_->mu);
    for (const auto& [id, c] : impl_->caches) caches.push_back(c);
  }
  std::vector<CacheInfo> out;
  for (const auto& c : caches) {
    if (absl::StatusOr<CacheInfo> info = c->Info(); info.ok()) out.push_back(*std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const CacheInfo& a, const CacheInfo& b) { return a.cache_id < b.cache_id; });
  return out;
}

void KvStore::DetachSession(const std::string& session_id, absl::Time release_at) {
  impl_->sessions.Detach(session_id, release_at);
}

bool KvStore::HasSession(const std::string& session_id) const {
  return impl_->sessions.Contains(session_id);
}

int KvStore::ReapSessions(absl::Time now) {
  int released = 0;
  for (const std::string& id : impl_->sessions.TakeExpired(now)) {
    std::shared_ptr<KvCache> cache;
    {
      absl::MutexLock lock(&impl_->mu);
      auto it = impl_->caches.find(id);
      if (it == impl_->caches.end()) continue;
      cache = it->second;
      impl_->caches.erase(it);
      --impl_->caches_per_pool[cache->pool()->id()];
    }
    cache->Release();
    ++released;
  }
  return released;
}

const Region* KvStore::TEST_PoolRegion(uint64_t pool_id) const {
  absl::ReaderMutexLock lock(&impl_->mu);
  if (pool_id >= impl_->pools_by_id.size()) return nullptr;
  return &impl_->pools_by_id[pool_id]->region();
}

}  // namespace kvarena
