#include "daemon/busy_caches.h"

namespace kvarena {

bool BusyCaches::Busy(absl::Span<const absl::string_view> ids) const {
  if (ids.empty() || held_count_.load(std::memory_order_acquire) == 0) return false;
  absl::MutexLock lock(&mu_);
  for (const absl::string_view id : ids) {
    if (!id.empty() && held_.contains(id)) return true;
  }
  return false;
}

void BusyCaches::Hold(absl::Span<const absl::string_view> ids) {
  if (ids.empty()) return;
  absl::MutexLock lock(&mu_);
  for (const absl::string_view id : ids) {
    if (!id.empty()) ++held_[std::string(id)];
  }
  held_count_.store(int(held_.size()), std::memory_order_release);
}

void BusyCaches::Release(absl::Span<const absl::string_view> ids) {
  if (ids.empty()) return;
  absl::MutexLock lock(&mu_);
  for (const absl::string_view id : ids) {
    const auto it = held_.find(id);
    if (it != held_.end() && --it->second == 0) held_.erase(it);
  }
  held_count_.store(int(held_.size()), std::memory_order_release);
}

}  // namespace kvarena
