// Clock: where core and the tiers read the time (session grace, idle TTL, the disk
// store's file stamps), a seam tests replace so that expiry is tested without sleeping (leveldb's
// Env::NowMicros).
//
// Thread-safety: every Clock is safe for concurrent use.
#ifndef KVARENA_BASE_CLOCK_H_
#define KVARENA_BASE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvarena {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The system clock; lives for the whole process.
Clock* RealClock();

// A clock that moves only when told to. Starts at the Unix epoch plus one day (so that
// "now minus a grace" is never before the epoch).
class FakeClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::UnixEpoch() + absl::Hours(24);
};

}  // namespace kvarena

#endif  // KVARENA_BASE_CLOCK_H_
