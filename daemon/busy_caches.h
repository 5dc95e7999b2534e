// BusyCaches: the caches a call handed to the Offload pool holds, so that a call on one of
// them is handed to the pool too instead of waiting for the cache's lock on one of gRPC's
// few callback threads (a Popn queued behind a long Attend on the same cache would hold
// that thread for the Attend's whole kernel; enough of them would stall every caller, the
// health service included). A cache id counts once per pooled call naming it; "" (no
// cache: a whole-arena Stats) is never held.
//
// Thread-safety: every method may be called from any thread. Busy() takes no lock while no
// pooled call holds a cache.
#ifndef KVARENA_DAEMON_BUSY_CACHES_H_
#define KVARENA_DAEMON_BUSY_CACHES_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace kvarena {

class BusyCaches {
 public:
  // Whether a pooled call holds any of ids.
  bool Busy(absl::Span<const absl::string_view> ids) const;
  // Marks ids held by one more pooled call; Release gives them back (the same ids).
  void Hold(absl::Span<const absl::string_view> ids);
  void Release(absl::Span<const absl::string_view> ids);

  int TEST_held() const { return held_count_.load(); }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> held_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> held_count_{0};  // held_'s size, read without mu_
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_BUSY_CACHES_H_
