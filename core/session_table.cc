#include "core/session_table.h"

#include <sys/random.h>

#include <cstdio>

#include "absl/strings/escaping.h"

namespace kvarena {

std::string SessionTable::Open(const std::string& client_name, std::shared_ptr<const Region> scratch,
                               uint64_t scratch_id) {
  char raw[16];
  size_t got = 0;
  while (got < sizeof(raw)) {
    const ssize_t r = getrandom(raw + got, sizeof(raw) - got, 0);
    if (r > 0) got += size_t(r);
  }
  std::string id = absl::BytesToHexString(absl::string_view(raw, sizeof(raw)));
  absl::MutexLock lock(&mu_);
  Session& s = sessions_[id];
  s.client_name = client_name;
  s.scratch = std::move(scratch);
  s.scratch_id = scratch_id;
  return id;
}

std::shared_ptr<const Region> SessionTable::Scratch(const std::string& id, uint64_t* scratch_id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.detached) return nullptr;
  *scratch_id = it->second.scratch_id;
  return it->second.scratch;
}

void SessionTable::Detach(const std::string& id, absl::Time release_at) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
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

bool SessionTable::AddCache(const std::string& id, const std::string& cache_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.detached) return false;
  it->second.caches.insert(cache_id);
  return true;
}

void SessionTable::RemoveCache(const std::string& id, const std::string& cache_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) it->second.caches.erase(cache_id);
}

std::vector<std::string> SessionTable::TakeExpired(absl::Time now) {
  std::vector<std::string> caches;
  absl::MutexLock lock(&mu_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second.detached && it->second.release_at <= now) {
      caches.insert(caches.end(), it->second.caches.begin(), it->second.caches.end());
      sessions_.erase(it++);
    } else {
      ++it;
    }
  }
  return caches;
}

}  // namespace kvarena
