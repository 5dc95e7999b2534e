// KvStore's sessions: attach, resume, detach, ownership and the reaper (kv_store.h).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/kv_store.h"
#include "core/kv_store_impl.h"
#include "kvarena/paged_kv.h"

namespace kvarena {
namespace {
constexpr size_t kMaxClientNameBytes = 128;
}  // namespace

absl::StatusOr<SessionAttachment> KvStore::AttachSession(const std::string& client_name,
                                                         const std::string& resume_token,
                                                         const SessionPeer& peer) {
  Impl& im = *impl_;
  if (!resume_token.empty()) return im.sessions.Resume(resume_token, im.clock->Now(), peer.owner);
  SessionTable::NewSession s;
  s.client_name = client_name.substr(0, kMaxClientNameBytes);
  s.peer = peer.key;
  s.owner = peer.owner;
  s.owner_max_sessions = peer.owner_max_sessions;
  s.scratch_id = kScratchRegionBase + im.next_scratch.fetch_add(1);
  // Created and charged when first exported (ExportRegion); a peer that cannot map it gets none.
  if (peer.can_map) {
    s.scratch_size = RoundUp(im.options.scratch_bytes, kChunkGranularity);
  }
  s.quota = im.NewQuota(peer.owner);
  return im.sessions.Open(std::move(s));
}

absl::StatusOr<std::string> KvStore::OpenSession(const std::string& client_name) {
  KVARENA_ASSIGN_OR_RETURN(SessionAttachment a, AttachSession(client_name, ""));
  return std::move(a.session_id);
}

bool KvStore::SessionOwnedBy(const std::string& session_id, const std::string& owner) const {
  return impl_->sessions.OwnedBy(session_id, owner);
}

bool KvStore::SessionOwnsCache(const std::string& session_id, const std::string& cache_id) const {
  return impl_->sessions.OwnsCache(session_id, cache_id);
}

void KvStore::DetachSession(const std::string& session_id, absl::Duration grace, uint64_t epoch) {
  impl_->sessions.Detach(session_id, impl_->clock->Now() + grace, epoch);
}

bool KvStore::HasSession(const std::string& session_id) const {
  return impl_->sessions.Contains(session_id);
}

void KvStore::Impl::TakeIdle(absl::Time now, std::vector<std::shared_ptr<KvCache>>* gone) {
  if (now < absl::FromUnixNanos(next_idle_scan.load(std::memory_order_relaxed))) return;
  const absl::Duration ttl = options.idle_ttl;
  // The walk takes the lock shared, so Find (every cache operation) and Stats go on while
  // it reads a million caches; only the expired ones are erased under the exclusive lock,
  // each checked again (a Find may have used it since).
  std::vector<std::shared_ptr<KvCache>> idle;
  absl::Time oldest = now;  // the least recent use among the sessionless caches kept
  {
    absl::ReaderMutexLock lock(&mu);
    for (const auto& [id, c] : caches) {
      if (!c->owner().empty()) continue;
      const absl::Time used = c->last_used();
      if (used + ttl <= now) {
        idle.push_back(c);
      } else {
        oldest = std::min(oldest, used);
      }
    }
  }
  if (!idle.empty()) {
    absl::MutexLock lock(&mu);
    for (std::shared_ptr<KvCache>& c : idle) {
      auto it = caches.find(c->id());
      if (it == caches.end() || it->second != c) continue;  // released meanwhile
      if (const absl::Time used = c->last_used(); used + ttl > now) {
        oldest = std::min(oldest, used);
        continue;
      }
      pools.RemoveCache(c->pool()->id());
      EraseLocked(it);
      gone->push_back(std::move(c));
    }
  }
  // A use only moves last_used forward, so no cache kept can expire before the oldest
  // one's use + ttl, and a cache allocated from now on not before now + ttl (one an
  // Allocate built while this ran is reaped at most that Allocate's duration late).
  next_idle_scan.store(absl::ToUnixNanos(oldest + ttl), std::memory_order_relaxed);
}

int KvStore::Reap() {
  Impl& im = *impl_;
  const absl::Time now = im.clock->Now();
  std::vector<std::shared_ptr<KvCache>> gone;
  const std::vector<SessionTable::Expired> expired = im.sessions.TakeExpired(now);
  for (const SessionTable::Expired& e : expired) {
    im.budget.Refund(e.scratch_charge);
    absl::MutexLock lock(&im.mu);
    for (const std::string& id : e.cache_ids) {
      auto it = im.caches.find(id);
      // Only what the session still owns: the id may name another session's cache since.
      if (it == im.caches.end() || it->second->owner() != e.session_id) continue;
      gone.push_back(it->second);
      im.pools.RemoveCache(it->second->pool()->id());
      im.EraseLocked(it);
    }
  }
  const size_t by_grace = gone.size();
  if (im.options.idle_ttl > absl::ZeroDuration()) im.TakeIdle(now, &gone);
  for (const auto& cache : gone) im.Remove(cache);
  // Counted after the pages went back: whoever sees a count move sees the arena it left.
  im.counters.sessions_reaped += expired.size();
  im.counters.caches_reaped_grace += by_grace;
  im.counters.caches_reaped_idle += gone.size() - by_grace;
  return int(gone.size());
}

}  // namespace kvarena
