// StopToken: tells a long kernel call that its caller no longer wants the result — its
// deadline passed or the caller went away (cancelled) — so that the work left is skipped.
//
// Framework-free: the daemon builds one from a gRPC call's deadline and IsCancelled(),
// core hands it down untouched (AttentionParams::stop), tests build one from a counting
// predicate. The CPU kernels poll it between units of work; the CUDA kernels ignore it.
//
// Thread-safety: Poll() and the accessors may run on many threads at once. The predicate
// is never run by two threads at once (gRPC's IsCancelled() plucks the call's completion
// queue, which few threads may do together). Once a Poll() has returned true every later
// one does, reading one atomic.
#ifndef KVARENA_KERNELS_STOP_TOKEN_H_
#define KVARENA_KERNELS_STOP_TOKEN_H_

#include <atomic>
#include <functional>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kvarena {

class StopToken {
 public:
  // Stops once absl::Now() reaches `deadline` (absl::InfiniteFuture(): never) or once
  // `cancelled` (may be empty) returns true; the deadline is read against the system
  // clock because that is what gRPC's deadlines are. `cancelled` runs at most once per
  // `cancelled_every` (zero: at every poll), so an expensive predicate stays cheap.
  StopToken(absl::Time deadline, std::function<bool()> cancelled,
            absl::Duration cancelled_every = absl::ZeroDuration());
  StopToken(const StopToken&) = delete;
  StopToken& operator=(const StopToken&) = delete;

  // Whether the call should stop now; true from the first time it was. The deadline is
  // checked first: a gRPC call past its deadline also reads as cancelled.
  bool Poll() const;
  // Whether a Poll() returned true (checks nothing new).
  bool stopped() const { return reason_.load(std::memory_order_acquire) != kRunning; }
  // OK while not stopped; else DEADLINE_EXCEEDED or CANCELLED, the message prefixed by `op`.
  absl::Status status(absl::string_view op) const;

 private:
  enum Reason : int { kRunning = 0, kDeadlineExceeded = 1, kCancelled = 2 };
  bool Stop(Reason reason) const;  // latches the first reason; returns true

  const absl::Time deadline_;
  const std::function<bool()> cancelled_;
  const absl::Duration cancelled_every_;
  mutable std::atomic<int> reason_{kRunning};
  mutable std::mutex mu_;  // runs cancelled_ one caller at a time
  mutable absl::Time next_cancel_check_ = absl::InfinitePast();  // guarded by mu_
};

}  // namespace kvarena

#endif  // KVARENA_KERNELS_STOP_TOKEN_H_
