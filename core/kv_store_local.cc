// The local path: Reserve and Commit over one or many caches, all or nothing.
#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/checked.h"
#include "base/status_macros.h"
#include "core/kv_store.h"
#include "core/kv_store_impl.h"
#include "core/refusal.h"

namespace kvarena {
namespace {

// Holds the locks of several caches, taken in address order so two calls listing the
// same caches in different orders cannot deadlock. The thread-safety analysis cannot
// follow a set of locks, so code under a MultiLock states each one it relies on with
// `c->mu().AssertHeld()` (absl's ABSL_ASSERT_EXCLUSIVE_LOCK) before a *Locked call.
class MultiLock {
 public:
  explicit MultiLock(std::vector<KvCache*> caches) : caches_(std::move(caches)) {
    std::sort(caches_.begin(), caches_.end());
    for (KvCache* c : caches_) c->mu().Lock();
  }
  ~MultiLock() {
    for (auto it = caches_.rbegin(); it != caches_.rend(); ++it) (*it)->mu().Unlock();
  }
  MultiLock(const MultiLock&) = delete;
  MultiLock& operator=(const MultiLock&) = delete;

 private:
  std::vector<KvCache*> caches_;
};

}  // namespace

absl::StatusOr<std::vector<std::shared_ptr<KvCache>>> KvStore::Impl::FindAll(
    absl::string_view op, const std::string& session, const std::vector<CacheTokens>& items) const {
  if (items.empty()) return absl::InvalidArgumentError(absl::StrCat(op, ": items is empty"));
  std::vector<std::shared_ptr<KvCache>> caches;
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!seen.insert(items[i].cache_id).second) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": items[", i, "] lists cache ",
                                                     Quoted(items[i].cache_id), " a second time"));
    }
    KVARENA_ASSIGN_OR_RETURN(auto cache, Find(session, items[i].cache_id));
    caches.push_back(std::move(cache));
  }
  return caches;
}

absl::StatusOr<std::vector<ReserveResult>> KvStore::Reserve(const std::string& session,
                                                            const std::vector<CacheTokens>& items) {
  KVARENA_ASSIGN_OR_RETURN(auto caches, impl_->FindAll("reserve", session, items));
  std::vector<KvCache*> raw;
  for (const auto& c : caches) raw.push_back(c.get());
  MultiLock lock(raw);

  // Count per pool and per quota, then charge every quota and take every pool's pages
  // (cleared) before handing any out; any refusal undoes what was taken.
  absl::flat_hash_map<PagePool*, int64_t> need;
  absl::flat_hash_map<Quota*, int64_t> charge;
  for (size_t i = 0; i < raw.size(); ++i) {
    raw[i]->mu().AssertHeld();
    absl::StatusOr<int64_t> pages = raw[i]->PagesToReserveLocked(items[i].tokens);
    if (!pages.ok()) {
      if (absl::IsResourceExhausted(pages.status())) raw[i]->CountRefusal();
      return pages.status();
    }
    std::optional<int64_t> pool_total = CheckedAdd(need[raw[i]->pool()], *pages);
    std::optional<int64_t> quota_total = CheckedAdd(charge[raw[i]->quota()], *pages);
    if (!pool_total || !quota_total) {
      return absl::InvalidArgumentError(
          absl::StrCat("reserve: items[", i, "] makes the page count overflow"));
    }
    need[raw[i]->pool()] = *pool_total;
    charge[raw[i]->quota()] = *quota_total;
  }
  std::vector<std::pair<Quota*, int64_t>> charged;
  PoolSet::PoolPages taken;
  PoolSet::PoolPages committed;  // chunks, to undo exactly
  auto undo = [&](absl::Status s) {
    for (auto& [pool, ids] : taken) pool->Unallocate(ids, committed[pool]);
    for (auto [quota, n] : charged) quota->RefundPages(n);
    if (!absl::IsInternal(s)) raw.front()->CountRefusal();
    return s;
  };
  for (const auto& [quota, n] : charge) {
    if (!quota->TryChargePages(n)) {
      return undo(RefusedError(
          quota->PagesRefusal(n),
          absl::StrCat("reserve: needs ", n, " page(s) but ", quota->DescribePages(n))));
    }
    charged.emplace_back(quota, n);
  }
  // Several pools plan their pages together, so that one refusing leaves none changed.
  const std::vector<std::pair<PagePool*, int64_t>> pools(need.begin(), need.end());
  absl::Status allocated =
      pools.size() == 1 ? impl_->pools.Allocate(pools[0].first, pools[0].second,
                                                &taken[pools[0].first], &committed[pools[0].first])
                        : impl_->pools.AllocateTogether(pools, &taken, &committed);
  if (!allocated.ok()) return undo(Annotated(allocated, "reserve: "));
  for (const auto& [pool, ids] : taken) {
    // No slot of a reserved page may show what its last owner wrote.
    if (absl::Status s = impl_->kernels->ClearPages(pool->layout(), pool->base(), ids.data(),
                                                    int64_t(ids.size()));
        !s.ok()) {
      return undo(absl::InternalError(absl::StrCat("reserve: ", s.message())));
    }
  }
  absl::flat_hash_map<PagePool*, size_t> next;
  std::vector<ReserveResult> out;
  for (size_t i = 0; i < raw.size(); ++i) {
    PagePool* pool = raw[i]->pool();
    raw[i]->mu().AssertHeld();
    out.push_back(raw[i]->AddReservedLocked(items[i].tokens, taken[pool], &next[pool]));
  }
  return out;
}

absl::StatusOr<std::vector<CacheInfo>> KvStore::Commit(const std::string& session,
                                                       const std::vector<CacheTokens>& items) {
  KVARENA_ASSIGN_OR_RETURN(auto caches, impl_->FindAll("commit", session, items));
  std::vector<KvCache*> raw;
  for (const auto& c : caches) raw.push_back(c.get());
  MultiLock lock(raw);
  for (size_t i = 0; i < raw.size(); ++i) {
    raw[i]->mu().AssertHeld();
    KVARENA_RETURN_IF_ERROR(raw[i]->CheckCommitLocked(items[i].tokens));
  }
  std::vector<CacheInfo> out;
  for (size_t i = 0; i < raw.size(); ++i) {
    raw[i]->mu().AssertHeld();
    out.push_back(raw[i]->CommitLocked(items[i].tokens));
  }
  return out;
}

}  // namespace kvarena
