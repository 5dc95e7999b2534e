// SessionTable: the attached workers. Each session has an unguessable id, the caches it
// owns, and — once its Attach stream broke — the time its caches are to be released.
//
// Thread-safety: safe for concurrent use (internal mutex). It only records cache ids;
// releasing them is the store's job.
#ifndef KVARENA_CORE_SESSION_TABLE_H_
#define KVARENA_CORE_SESSION_TABLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "arena/region.h"

namespace kvarena {

class SessionTable {
 public:
  // Returns a fresh id: 128 bits from the system's CSPRNG, as 32 hex digits. The session
  // owns `scratch` (may be null) under region id `scratch_id`.
  std::string Open(const std::string& client_name, std::shared_ptr<const Region> scratch,
                   uint64_t scratch_id);
  // The scratch region of a live session; null when unknown, detached or without one.
  std::shared_ptr<const Region> Scratch(const std::string& id, uint64_t* scratch_id) const;
  // Starts the grace period; a no-op for an unknown id.
  void Detach(const std::string& id, absl::Time release_at);
  bool Contains(const std::string& id) const;
  int64_t size() const;

  // Records that cache_id belongs to session id; false when the session is unknown or
  // already detached (its caches are on their way out).
  bool AddCache(const std::string& id, const std::string& cache_id);
  void RemoveCache(const std::string& id, const std::string& cache_id);

  // Removes every session whose grace ended by `now`; returns their cache ids.
  std::vector<std::string> TakeExpired(absl::Time now);

 private:
  struct Session {
    std::string client_name;
    std::shared_ptr<const Region> scratch;
    uint64_t scratch_id = 0;
    absl::flat_hash_set<std::string> caches;
    bool detached = false;
    absl::Time release_at = absl::InfiniteFuture();
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvarena

#endif  // KVARENA_CORE_SESSION_TABLE_H_
