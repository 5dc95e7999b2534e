#include "kernels/stop_token.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvarena {

StopToken::StopToken(absl::Time deadline, std::function<bool()> cancelled,
                     absl::Duration cancelled_every)
    : deadline_(deadline), cancelled_(std::move(cancelled)), cancelled_every_(cancelled_every) {}

bool StopToken::Stop(Reason reason) const {
  int expected = kRunning;
  reason_.compare_exchange_strong(expected, reason, std::memory_order_acq_rel);
  return true;
}

bool StopToken::Poll() const {
  if (stopped()) return true;
  const bool timed = deadline_ != absl::InfiniteFuture() || cancelled_every_ > absl::ZeroDuration();
  const absl::Time now = timed ? absl::Now() : absl::InfinitePast();
  if (now >= deadline_) return Stop(kDeadlineExceeded);
  if (!cancelled_) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped()) return true;
  if (now < next_cancel_check_) return false;
  next_cancel_check_ = now + cancelled_every_;
  return cancelled_() ? Stop(kCancelled) : false;
}

absl::Status StopToken::status(absl::string_view op) const {
  switch (reason_.load(std::memory_order_acquire)) {
    case kDeadlineExceeded:
      return absl::DeadlineExceededError(absl::StrCat(
          op, "the call's deadline (", absl::FormatTime(deadline_, absl::UTCTimeZone()),
          ") passed; stopped early"));
    case kCancelled:
      return absl::CancelledError(absl::StrCat(op, "the caller cancelled the call; stopped early"));
    default:
      break;
  }
  return absl::OkStatus();
}

}  // namespace kvarena
