#include "core/session_table.h"

#include <sys/random.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/refusal.h"

namespace kvarena {
namespace {

// 128 bits from the system's CSPRNG, as 32 hex digits.
std::string RandomHex128() {
  char raw[16];
  size_t got = 0;
  while (got < sizeof(raw)) {
    const ssize_t r = getrandom(raw + got, sizeof(raw) - got, 0);
    if (r > 0) got += size_t(r);
  }
  return absl::BytesToHexString(absl::string_view(raw, sizeof(raw)));
}

}  // namespace

absl::StatusOr<SessionAttachment> SessionTable::Open(NewSession session) {
  SessionAttachment a;
  a.session_id = RandomHex128();
  a.resume_token = RandomHex128();
  a.epoch = 1;
  absl::MutexLock lock(&mu_);
  if (int64_t(sessions_.size()) >= max_sessions_) {
    return RefusedError(Refusal::kMaxSessions,
                        absl::StrCat("attach: ", sessions_.size(),
                                     " sessions are held (attached or in their grace period); "
                                     "max_sessions=",
                                     max_sessions_));
  }
  if (session.owner_max_sessions > 0) {
    int64_t owned = 0;
    for (const auto& [id, s] : sessions_) owned += s.info.owner == session.owner ? 1 : 0;
    if (owned >= session.owner_max_sessions) {
      return RefusedError(Refusal::kMaxSessions,
                          absl::StrCat("attach: '", session.owner, "' holds ", owned,
                                       " sessions (attached or in their grace "
                                       "period); its max_sessions=",
                                       session.owner_max_sessions));
    }
  }
  if (!session.peer.empty()) {
    if (auto it = per_peer_.find(session.peer);
        it != per_peer_.end() && it->second >= max_per_peer_) {
      return RefusedError(Refusal::kMaxSessionsPerPeer,
                          absl::StrCat("attach: ", session.peer, " holds ", it->second,
                                       " sessions (attached or in their grace "
                                       "period); max_sessions_per_peer=",
                                       max_per_peer_));
    }
    ++per_peer_[session.peer];
  }
  Session& s = sessions_[a.session_id];
  s.info = std::move(session);
  s.resume_token = a.resume_token;
  by_token_[a.resume_token] = a.session_id;
  ++counts_.opened;
  return a;
}

absl::StatusOr<SessionAttachment> SessionTable::Resume(const std::string& resume_token,
                                                       absl::Time now, const std::string& owner) {
  std::string next_token = RandomHex128();  // drawn before the lock: getrandom may block
  absl::MutexLock lock(&mu_);
  auto t = by_token_.find(resume_token);
  Session* s = nullptr;
  if (t != by_token_.end()) s = &sessions_.at(t->second);
  if (s == nullptr || s->info.owner != owner || (s->detached && s->release_at <= now)) {
    return absl::NotFoundError(
        "attach: no session holds this resume_token (its grace period ended, kvarenad "
        "restarted, or it was never issued); its caches are gone");
  }
  if (s->detached) --counts_.in_grace;
  ++counts_.resumed;
  s->detached = false;
  s->release_at = absl::InfiniteFuture();
  ++s->epoch;
  // The token rotates: whoever held the old one (a stream taken over, a leaked log line)
  // can no longer take the session.
  const std::string id = t->second;
  by_token_.erase(t);
  by_token_[next_token] = id;
  s->resume_token = next_token;
  return SessionAttachment{id, std::move(next_token), s->epoch, /*resumed=*/true};
}

bool SessionTable::OwnedBy(const std::string& id, const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  return it != sessions_.end() && it->second.info.owner == owner;
}

std::optional<std::string> SessionTable::OwnerOf(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.detached) return std::nullopt;
  return it->second.info.owner;
}

absl::StatusOr<SessionTable::ScratchView> SessionTable::Scratch(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (id.empty() || it == sessions_.end() || it->second.detached) {
    return absl::FailedPreconditionError("no attached session (Attach first)");
  }
  const Session& s = it->second;
  return ScratchView{s.info.scratch_id, s.info.scratch_size, s.scratch};
}

std::shared_ptr<const Region> SessionTable::SetScratch(const std::string& id,
                                                       std::shared_ptr<const Region> region,
                                                       size_t charge) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.detached) return nullptr;
  Session& s = it->second;
  if (s.scratch == nullptr) {
    s.scratch = std::move(region);
    s.scratch_charge = charge;
    scratch_bytes_ += charge;
    ++scratch_regions_;
  }
  return s.scratch;
}

std::shared_ptr<Quota> SessionTable::QuotaOf(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.detached) return nullptr;
  return it->second.info.quota;
}

void SessionTable::Detach(const std::string& id, absl::Time release_at, uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || (epoch != 0 && epoch != it->second.epoch)) return;
  if (!it->second.detached) {
    ++counts_.in_grace;
    ++counts_.detached;
  }
  it->second.detached = true;
  it->second.release_at = release_at;
}

bool SessionTable::Contains(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  return it != sessions_.end() && !it->second.detached;
}

int64_t SessionTable::size() const {
  absl::MutexLock lock(&mu_);
  return int64_t(sessions_.size());
}

size_t SessionTable::scratch_bytes() const {
  absl::MutexLock lock(&mu_);
  return scratch_bytes_;
}

int64_t SessionTable::scratch_regions() const {
  absl::MutexLock lock(&mu_);
  return scratch_regions_;
}

SessionTable::Counts SessionTable::counts() const {
  absl::MutexLock lock(&mu_);
  Counts c = counts_;
  c.held = int64_t(sessions_.size());
  return c;
}

absl::Status SessionTable::AddCache(const std::string& id, const std::string& cache_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.detached) {
    return absl::FailedPreconditionError("allocate: the session detached while allocating");
  }
  it->second.caches.insert(cache_id);
  return absl::OkStatus();
}

void SessionTable::RemoveCache(const std::string& id, const std::string& cache_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) it->second.caches.erase(cache_id);
}

bool SessionTable::OwnsCache(const std::string& id, const std::string& cache_id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  return it != sessions_.end() && it->second.caches.contains(cache_id);
}

std::vector<SessionTable::Expired> SessionTable::TakeExpired(absl::Time now) {
  std::vector<Expired> out;
  absl::MutexLock lock(&mu_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    Session& s = it->second;
    if (!s.detached || s.release_at > now) {
      ++it;
      continue;
    }
    Expired e;
    e.session_id = it->first;
    e.cache_ids.assign(s.caches.begin(), s.caches.end());
    if (s.scratch) {
      e.scratch_charge = s.scratch_charge;
      scratch_bytes_ -= s.scratch_charge;
      --scratch_regions_;
    }
    out.push_back(std::move(e));
    by_token_.erase(s.resume_token);
    if (auto p = per_peer_.find(s.info.peer); p != per_peer_.end() && --p->second == 0)
      per_peer_.erase(p);
    --counts_.in_grace;
    sessions_.erase(it++);
  }
  return out;
}

}  // namespace kvarena
