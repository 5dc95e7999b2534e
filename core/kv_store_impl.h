// The state behind KvStore, shared by its implementation files (kv_store.cc: caches,
// sessions, stats; kv_store_local.cc: the local path). Internal to core/.
// Thread-safety: as KvStore; `mu` guards the maps, each cache and pool locks itself.
#ifndef KVARENA_CORE_KV_STORE_IMPL_H_
#define KVARENA_CORE_KV_STORE_IMPL_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "core/kv_cache.h"
#include "core/kv_store.h"
#include "core/page_pool.h"
#include "core/session_table.h"
#include "kernels/kv_kernels.h"

namespace kvarena {

using PoolKey = std::tuple<int, int, int, int>;  // dtype, page_size, kv heads, head_dim

struct KvStore::Impl {
  Impl(const StoreOptions& o, std::unique_ptr<Backend> b)
      : options(o), backend(std::move(b)), scratch_backend(NewHostBackend()),
        budget(o.arena_bytes),
        kernels(o.kernels ? o.kernels : std::shared_ptr<KvKernels>(NewCpuKvKernels(o.num_threads))) {}

  // The live cache named id, if `session` may touch it.
  absl::StatusOr<std::shared_ptr<KvCache>> Find(const std::string& session, const std::string& id,
                                                bool check_owner = true) const;
  absl::Status CheckSession(const std::string& session) const;
  absl::StatusOr<PagePool*> PoolFor(const CacheSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The caches a Reserve / Commit lists, each at most once and each the session's.
  absl::StatusOr<std::vector<std::shared_ptr<KvCache>>> FindAll(
      absl::string_view op, const std::string& session, const std::vector<CacheTokens>& items) const;

  const StoreOptions options;
  const std::unique_ptr<Backend> backend;
  const std::unique_ptr<Backend> scratch_backend;  // host memory, whatever the pools use
  std::atomic<uint64_t> next_scratch{0};
  ArenaBudget budget;
  const std::shared_ptr<KvKernels> kernels;
  StoreCounters counters;
  SessionTable sessions;

  mutable absl::Mutex mu;
  std::map<PoolKey, std::unique_ptr<PagePool>> pools ABSL_GUARDED_BY(mu);
  std::vector<PagePool*> pools_by_id ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, std::shared_ptr<KvCache>> caches ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint64_t, int64_t> caches_per_pool ABSL_GUARDED_BY(mu);
  uint64_t next_cache = 1 ABSL_GUARDED_BY(mu);
};

}  // namespace kvarena

#endif  // KVARENA_CORE_KV_STORE_IMPL_H_
