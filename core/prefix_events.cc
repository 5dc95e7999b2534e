#include "core/prefix_events.h"

#include <algorithm>
#include <new>
#include <utility>

namespace kvarena {

size_t PrefixEventLog::Bytes(const PrefixEvent& e) {
  return sizeof(PrefixEvent) + e.token_ids.size() * sizeof(int32_t) + e.prefix_namespace.size();
}

void PrefixEventLog::Append(PrefixEvent e) {
  {
    absl::MutexLock lock(&mu_);
    e.seq = next_seq_++;
    try {
      events_.push_back(std::move(e));
      bytes_ += Bytes(events_.back());
    } catch (const std::bad_alloc&) {
      // Out of memory: forget every event, so each watcher learns it lost some and
      // resynchronises, rather than miss this one silently (pools append from
      // destructors, which must not throw).
      events_.clear();
      bytes_ = 0;
    }
    while (events_.size() > 1 && (events_.size() > capacity_ || bytes_ > max_bytes_)) {
      bytes_ -= Bytes(events_.front());
      events_.pop_front();
    }
  }
  if (listener_) {
    try {
      listener_();
    } catch (const std::bad_alloc&) {
      // The watchers catch up at the next event.
    }
  }
}

std::vector<PrefixEvent> PrefixEventLog::ReadFrom(uint64_t from_seq, size_t max, bool* lost) const {
  absl::MutexLock lock(&mu_);
  const uint64_t oldest = events_.empty() ? next_seq_ : events_.front().seq;
  // Past the newest event: a seq of another incarnation of the log (a restarted daemon).
  // Nothing between it and now can be vouched for, so replay all that is kept.
  const bool beyond = from_seq > next_seq_;
  *lost = (from_seq != 0 && from_seq < oldest) || beyond;
  const uint64_t first = beyond ? oldest : std::max(from_seq, oldest);
  std::vector<PrefixEvent> out;
  for (uint64_t s = first; s < next_seq_ && out.size() < max; ++s)
    out.push_back(events_[size_t(s - oldest)]);
  return out;
}

size_t PrefixEventLog::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

uint64_t PrefixEventLog::next_seq() const {
  absl::MutexLock lock(&mu_);
  return next_seq_;
}

uint64_t PrefixEventLog::oldest_seq() const {
  absl::MutexLock lock(&mu_);
  return events_.empty() ? next_seq_ : events_.front().seq;
}

}  // namespace kvarena
