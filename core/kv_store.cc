#include "core/kv_store.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/checked.h"
#include "base/status_macros.h"
#include "core/kv_store_impl.h"
#include "core/refusal.h"
#include "core/validate.h"

namespace kvarena {

absl::Status KvStore::Impl::CheckSession(const std::string& session) const {
  if (session.empty() || sessions.Contains(session)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "session is unknown or detached: Attach again before using it");
}

absl::StatusOr<std::shared_ptr<KvCache>> KvStore::Impl::Find(const std::string& session,
                                                             const std::string& id,
                                                             bool check_owner) const {
  if (check_owner) KVARENA_RETURN_IF_ERROR(CheckSession(session));
  std::shared_ptr<KvCache> cache;
  {
    absl::ReaderMutexLock lock(&mu);
    auto it = caches.find(id);
    if (it == caches.end())
      return absl::NotFoundError(absl::StrCat("cache ", Quoted(id), " not found"));
    cache = it->second;
  }
  if (check_owner && !cache->owner().empty() && cache->owner() != session) {
    return absl::PermissionDeniedError(
        absl::StrCat("cache ", Quoted(id), " belongs to another session"));
  }
  if (check_owner) cache->Touch(clock->Now());
  return cache;
}

CacheContext KvStore::Impl::ContextFor(std::shared_ptr<PagePool> pool,
                                       std::shared_ptr<Quota> quota) {
  CacheContext ctx;
  ctx.pool = std::move(pool);
  ctx.quota = std::move(quota);
  ctx.kernels = kernels.get();
  ctx.counters = &counters;
  ctx.limits = &limits;
  ctx.max_reply_bytes = options.max_reply_bytes;
  ctx.allocate = [this](PagePool* p, int64_t n, std::vector<int32_t>* ids,
                        std::vector<int32_t>* committed) {
    return pools.Allocate(p, n, ids, committed);
  };
  ctx.reclaim_metadata = [this](const ByteBudget* budget, size_t bytes) {
    return ReclaimMetadata(budget, bytes);
  };
  ctx.trim_cached_metadata = [this] { TrimCachedMetadata(); };
  ctx.prefix_hash_bits = options.TEST_prefix_hash_bits;
  ctx.metadata = &metadata;
  ctx.tiers = options.tiers.get();
  return ctx;
}

absl::StatusOr<KvStore::Impl::CacheMetadata> KvStore::Impl::BeginCacheMetadata(
    absl::string_view op, const CacheSpec& spec, const std::string& cache_id, Quota* quota,
    size_t later_bytes) {
  ByteBudget* budget = quota->metadata();
  // A generated id ("cache-N") is at most this long.
  constexpr size_t kGeneratedIdBytes = 32;
  CacheMetadata m{BudgetCharge(budget),
                  KvCache::FixedMetadataBytes(
                      spec, cache_id.empty() ? std::string(kGeneratedIdBytes, ' ') : cache_id)};
  if (m.charge.Resize(m.bytes)) return m;
  // Cached prefixes give metadata back before anything is refused.
  if (const size_t all = SaturatingAdd(m.bytes, later_bytes); CanReclaimMetadata(budget, all)) {
    m.reclaim = all;
    return m;
  }
  counters.refusals += 1;
  return RefusedError(Refusal::kMetadataBytes,
                      absl::StrCat(op, ": a cache of ", spec.num_layers, " layers takes ", m.bytes,
                                   " bytes of metadata but ", budget->Describe()));
}

absl::StatusOr<BudgetCharge> KvStore::Impl::FinishCacheMetadata(absl::string_view op,
                                                                const CacheSpec& spec,
                                                                CacheMetadata m) {
  if (m.reclaim == 0) return std::move(m.charge);
  ReclaimMetadata(m.charge.budget(), m.reclaim);
  if (m.charge.Resize(m.bytes)) return std::move(m.charge);
  counters.refusals += 1;  // another caller took the room meanwhile
  return RefusedError(Refusal::kMetadataBytes,
                      absl::StrCat(op, ": a cache of ", spec.num_layers, " layers takes ", m.bytes,
                                   " bytes of metadata but ", m.charge.budget()->Describe()));
}

void KvStore::Impl::Remove(const std::shared_ptr<KvCache>& cache) {
  cache->Release();
  if (!cache->owner().empty()) sessions.RemoveCache(cache->owner(), cache->id());
  int dropped = 0;
  {
    absl::MutexLock lock(&mu);
    dropped = pools.DropIdle();
  }
  if (dropped > 0) RegionsChanged();
}

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::Create(const StoreOptions& options,
                                                         std::unique_ptr<Backend> backend) {
  if (options.arena_bytes < kChunkGranularity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arena_bytes=", options.arena_bytes, " is below one chunk (", kChunkGranularity, ")"));
  }
  if (options.default_page_size < 1 || options.default_page_size > kMaxPageSize) {
    return absl::InvalidArgumentError(absl::StrCat("page_size=", options.default_page_size,
                                                   " must be in [1, ", kMaxPageSize, "]"));
  }
  for (auto [name, value] : {std::pair("max_pools", int64_t(options.max_pools)),
                             std::pair("max_sessions", options.max_sessions),
                             std::pair("max_sessions_per_peer", options.max_sessions_per_peer),
                             std::pair("max_caches", options.max_caches),
                             std::pair("max_caches_per_session", options.max_caches_per_session),
                             std::pair("max_request_tokens", options.max_request_tokens),
                             std::pair("max_attend_work", options.max_attend_work)}) {
    if (value < 1)
      return absl::InvalidArgumentError(absl::StrCat(name, "=", value, " must be >= 1"));
  }
  if (options.prefix_event_capacity < 1 || options.prefix_event_bytes < 1) {
    return absl::InvalidArgumentError("prefix_event_capacity and prefix_event_bytes must be >= 1");
  }
  if (options.TEST_prefix_hash_bits < 0 || options.TEST_prefix_hash_bits > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix hash bits=", options.TEST_prefix_hash_bits, " must be in [0, 128]"));
  }
  if (options.cpu_pool_awake < absl::ZeroDuration() || options.cpu_pool_awake > absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu_pool_awake=", absl::FormatDuration(options.cpu_pool_awake), " must be in [0, 1s]"));
  }
  if (options.session_max_pages < 0 || options.idle_ttl < absl::ZeroDuration() ||
      options.max_reply_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("session_max_pages=", options.session_max_pages,
                     ", idle_ttl=", absl::FormatDuration(options.idle_ttl), " and max_reply_bytes=",
                     options.max_reply_bytes, " must not be negative (max_reply_bytes > 0)"));
  }
  return std::unique_ptr<KvStore>(new KvStore(std::make_unique<Impl>(options, std::move(backend))));
}

KvStore::KvStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvStore::~KvStore() {
  {
    // Caches return their pages before the pools go.
    absl::MutexLock lock(&impl_->mu);
    impl_->caches.clear();
  }
  if (TierSet* tiers = impl_->options.tiers.get(); tiers != nullptr) {
    impl_->pools.Clear();  // what the pools cached goes down to the tiers
    tiers->Flush();
    tiers->SetEvents(nullptr);
  }
}

absl::StatusOr<CacheInfo> KvStore::Allocate(const std::string& session, const CacheSpec& spec,
                                            const std::string& cache_id,
                                            const AllocateOptions& options,
                                            const std::string& owner) {
  Impl& im = *impl_;
  KVARENA_RETURN_IF_ERROR(im.CheckSession(session));
  KVARENA_ASSIGN_OR_RETURN(CacheSpec resolved,
                           ResolveSpec(spec, im.options.default_page_size, im.limits));
  KVARENA_RETURN_IF_ERROR(
      CheckTokenIds("allocate", "prompt_tokens", options.prompt_tokens, im.limits));
  if (absl::Status s = im.kernels->CheckLayout(LayoutOf(resolved)); !s.ok()) {
    return Annotated(s, "allocate: ");
  }
  if (cache_id.size() > kMaxCacheIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("allocate: cache_id has ", cache_id.size(),
                                                   " bytes; at most ", kMaxCacheIdBytes));
  }
  std::shared_ptr<Quota> quota =
      session.empty() ? im.SessionlessOf(owner) : im.sessions.QuotaOf(session);
  const std::optional<std::string> pool_owner =
      session.empty() ? owner : im.sessions.OwnerOf(session);
  // Null or none: the session detached meanwhile.
  if (quota == nullptr || !pool_owner.has_value()) return im.CheckSession(session);
  KVARENA_ASSIGN_OR_RETURN(
      Impl::CacheMetadata planned,
      im.BeginCacheMetadata(
          "allocate", resolved, cache_id, quota.get(),
          KvCache::DeclaredMetadataBytes(resolved, int64_t(options.prompt_tokens.size()))));
  if (!quota->TryAddCache()) {
    return RefusedError(
        quota->CachesRefusal(),
        absl::StrCat("allocate: ",
                     quota->DescribeCaches(session.empty() ? "the set of caches without a session"
                                                           : "the session")));
  }
  // From here on every refusal gives the quota's count back; the cache takes it over.
  // The id and the pool are reserved under the map lock; the cache is built, and its
  // prompt hashed and adopted, outside it, so a long prompt stalls no other caller.
  bool created = false;
  std::shared_ptr<PagePool> pool;
  // An idle pool that gave way to this geometry goes once the map lock is released, so no
  // other call waits while its memory and cached pages go.
  std::shared_ptr<PagePool> displaced;
  std::string id = cache_id;
  {
    absl::MutexLock lock(&im.mu);
    absl::Status refused;
    const size_t alive = im.caches.size() + im.pending.size();
    if (int64_t(alive) >= im.options.max_caches) {
      refused = RefusedError(Refusal::kMaxCaches,
                             absl::StrCat("allocate: ", alive,
                                          " caches are alive; max_caches=", im.options.max_caches));
    } else if (id.empty()) {
      do id = absl::StrCat("cache-", im.next_cache++);
      while (im.caches.contains(id) || im.pending.contains(id));
    } else if (im.caches.contains(id) || im.pending.contains(id)) {
      refused =
          absl::AlreadyExistsError(absl::StrCat("allocate: cache ", Quoted(id), " already exists"));
    }
    if (refused.ok()) {
      absl::StatusOr<std::shared_ptr<PagePool>> p =
          im.pools.PoolFor(resolved, *pool_owner, &created, &displaced);
      if (p.ok())
        pool = *std::move(p);
      else
        refused = p.status();
    }
    if (refused.ok() && !session.empty()) refused = im.sessions.AddCache(session, id);
    if (!refused.ok()) {
      quota->RemoveCache();
      if (created) im.pools.DropIfUnused(pool.get());
      return refused;
    }
    im.pending.insert(id);
    im.pools.AddCache(pool->id());
  }
  displaced = nullptr;
  // Past every other check: cached prefixes may now give metadata back for this cache.
  absl::StatusOr<BudgetCharge> metadata =
      im.FinishCacheMetadata("allocate", resolved, std::move(planned));
  if (!metadata.ok()) {
    bool dropped = false;
    {
      absl::MutexLock lock(&im.mu);
      im.pending.erase(id);
      im.pools.RemoveCache(pool->id());
      dropped = created && im.pools.DropIfUnused(pool.get());
    }
    if (!session.empty()) im.sessions.RemoveCache(session, id);
    quota->RemoveCache();
    if (created && !dropped) im.RegionsChanged();
    return metadata.status();
  }
  if (created) im.RegionsChanged();
  auto cache =
      std::make_shared<KvCache>(id, std::move(resolved), session, im.ContextFor(pool, quota),
                                im.clock->Now(), *std::move(metadata));
  // Adopted before anyone can see the cache, under the pool's lock (no page reclaimed
  // between the lookup and the adoption).
  absl::Status started = cache->StartWithPrompt(options.prompt_tokens);
  {
    absl::MutexLock lock(&im.mu);
    im.pending.erase(id);
    // A session reaped meanwhile takes its caches with it, this one included.
    if (started.ok() && !session.empty() && !im.sessions.Contains(session))
      started = im.CheckSession(session);
    if (started.ok()) {
      im.AddLocked(cache);
    } else {
      im.pools.RemoveCache(pool->id());
    }
  }
  if (!started.ok()) {
    im.Remove(cache);  // its pages back, its session's record gone, the pool dropped when idle
    return started;
  }
  return cache->Info();
}

absl::StatusOr<AppendResult> KvStore::Append(const std::string& session,
                                             const std::string& cache_id, int layer, int64_t pos,
                                             const TensorArg& k, const TensorArg& v) {
  KVARENA_ASSIGN_OR_RETURN(auto cache, impl_->Find(session, cache_id));
  return (cache)->Append(layer, pos, k, v);
}

absl::StatusOr<AttendResult> KvStore::Attend(const std::string& session, const AttendArgs& args,
                                             void* out, size_t out_bytes, const StopToken* stop) {
  KVARENA_ASSIGN_OR_RETURN(auto cache, impl_->Find(session, args.cache_id));
  return (cache)->Attend(args, out, out_bytes, stop);
}

absl::StatusOr<PopnResult> KvStore::Popn(const std::string& session, const std::string& cache_id,
                                         uint64_t n) {
  KVARENA_ASSIGN_OR_RETURN(auto cache, impl_->Find(session, cache_id));
  return (cache)->Popn(n);
}

absl::StatusOr<CacheInfo> KvStore::Reset(const std::string& session, const std::string& cache_id,
                                         bool keep_pages) {
  KVARENA_ASSIGN_OR_RETURN(auto cache, impl_->Find(session, cache_id));
  return (cache)->Reset(keep_pages);
}

absl::Status KvStore::Release(const std::string& session, const std::string& cache_id) {
  KVARENA_ASSIGN_OR_RETURN(auto cache, impl_->Find(session, cache_id));
  {
    absl::MutexLock lock(&impl_->mu);
    auto it = impl_->caches.find(cache_id);
    if (it == impl_->caches.end() || it->second != cache) {
      return absl::NotFoundError(absl::StrCat("cache ", Quoted(cache_id), " not found"));
    }
    impl_->EraseLocked(it);
    impl_->pools.RemoveCache((cache)->pool()->id());
  }
  impl_->Remove(cache);
  return absl::OkStatus();
}

absl::StatusOr<GetKvResult> KvStore::GetKv(const std::string& session, const std::string& cache_id,
                                           int layer, const GetKvRange& range) {
  KVARENA_ASSIGN_OR_RETURN(auto cache, impl_->Find(session, cache_id));
  return (cache)->GetKv(layer, range);
}

absl::StatusOr<CacheDescription> KvStore::Describe(const std::string& session,
                                                   const std::string& cache_id) {
  KVARENA_ASSIGN_OR_RETURN(auto cache, impl_->Find(session, cache_id));
  return (cache)->Describe();
}

}  // namespace kvarena
