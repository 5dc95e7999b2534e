// PrefixEventLog: what changed in the arena's prefix indexes, for routers that place
// requests where their prefix is cached (WatchEvents). A page registered under its chained
// hash is BlockStored, a cached page reclaimed (its hash no longer hits) is BlockRemoved,
// a pool destroyed with pages still indexed is AllCleared for that pool. Each event gets
// the next sequence number (from 1); the log keeps the last `capacity` of them, so a
// watcher that falls behind, or asks for an older sequence, learns that events were lost
// and resynchronises (treat everything as cleared, then apply what follows).
//
// Thread-safety: safe for concurrent use. Pools append under their own lock (the log's
// lock is last in DESIGN.md's lock order); the listener runs after each append with no
// log lock held and must not call into the store.
#ifndef KVARENA_CORE_PREFIX_EVENTS_H_
#define KVARENA_CORE_PREFIX_EVENTS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/prefix_hash.h"

namespace kvarena {

struct PrefixEvent {
  enum class Kind : uint8_t { kStored, kRemoved, kAllCleared };
  uint64_t seq = 0;
  Kind kind = Kind::kStored;
  uint64_t pool_id = 0;
  int layer = 0;                   // stored / removed
  Hash128 hash;                    // stored / removed: the page's chained hash
  Hash128 parent_hash;             // stored: the page before it's (or the namespace root's)
  std::vector<int32_t> token_ids;  // stored: the page's token ids
  std::string prefix_namespace;    // stored: the namespace of the page's chain
  // stored / removed: where the page is (or was) kept — "" for the arena (the daemon
  // encodes its own medium, "cpu" or "cuda:0"), else a tier's: "host", "disk", "redis".
  std::string medium;
};

class PrefixEventLog {
 public:
  // capacity >= 1 events, max_bytes >= 1: the newest event is always kept.
  explicit PrefixEventLog(size_t capacity, size_t max_bytes = SIZE_MAX)
      : capacity_(capacity), max_bytes_(max_bytes) {}
  PrefixEventLog(const PrefixEventLog&) = delete;
  PrefixEventLog& operator=(const PrefixEventLog&) = delete;

  // What an event costs the log: the struct, its token ids and its namespace.
  static size_t Bytes(const PrefixEvent& e);
  // Appends e (its seq is assigned), dropping the oldest beyond capacity or max_bytes.
  // Never throws: out of memory, it drops every event kept (readers learn they lost
  // events), so pools may record from their destructors.
  void Append(PrefixEvent e) ABSL_LOCKS_EXCLUDED(mu_);
  size_t bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Up to max events with seq >= from_seq (0: from the oldest kept), oldest first.
  // *lost: events in [from_seq, first returned) are no longer kept, or from_seq is past
  // next_seq() (then the events come from the oldest kept, as for 0).
  std::vector<PrefixEvent> ReadFrom(uint64_t from_seq, size_t max, bool* lost) const
      ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t next_seq() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t oldest_seq() const ABSL_LOCKS_EXCLUDED(mu_);  // next_seq() when empty
  // Called after every Append; set once, before any pool exists.
  void SetListener(std::function<void()> listener) { listener_ = std::move(listener); }

 private:
  const size_t capacity_;
  const size_t max_bytes_;
  std::function<void()> listener_;
  mutable absl::Mutex mu_;
  std::deque<PrefixEvent> events_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvarena

#endif  // KVARENA_CORE_PREFIX_EVENTS_H_
