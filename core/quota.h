// Quota: what one session's caches may hold together — a number of caches and of pages,
// and bytes of metadata (its share of the daemon's --metadata_bytes) — charged as caches
// are allocated and take pages or declare tokens, refunded as they give them back. The
// caches allocated without a session share one Quota of the same bounds.
//
// Thread-safety: safe for concurrent use (atomics; a charge never overshoots its bound).
#ifndef KVARENA_CORE_QUOTA_H_
#define KVARENA_CORE_QUOTA_H_

#include <atomic>
#include <cstdint>
#include <limits>

#include "core/byte_budget.h"

namespace kvarena {

class Quota {
 public:
  // max_pages 0: no page bound. max_metadata_bytes 0: none beyond `metadata`, the daemon's
  // budget its charges also take from (may be null; it outlives the quota).
  Quota(int64_t max_caches, int64_t max_pages, size_t max_metadata_bytes = 0, ByteBudget* metadata = nullptr)
      : max_caches_(max_caches), max_pages_(max_pages),
        metadata_(max_metadata_bytes == 0 ? std::numeric_limits<size_t>::max() : max_metadata_bytes, metadata,
                  "session_metadata_bytes") {}
  Quota(const Quota&) = delete;
  Quota& operator=(const Quota&) = delete;

  bool TryAddCache() { return TryCharge(caches_, 1, max_caches_); }
  void RemoveCache() { caches_.fetch_sub(1, std::memory_order_relaxed); }
  // Charges n >= 0 pages if they fit; false (nothing charged) otherwise.
  bool TryChargePages(int64_t n) { return max_pages_ == 0 ? Add(pages_, n) : TryCharge(pages_, n, max_pages_); }
  void RefundPages(int64_t n) { pages_.fetch_sub(n, std::memory_order_relaxed); }

  int64_t caches() const { return caches_.load(std::memory_order_relaxed); }
  int64_t pages() const { return pages_.load(std::memory_order_relaxed); }
  // The session's metadata budget, inside the daemon's: what its caches charge.
  ByteBudget* metadata() { return &metadata_; }
  int64_t max_caches() const { return max_caches_; }
  int64_t max_pages() const { return max_pages_; }

 private:
  static bool Add(std::atomic<int64_t>& v, int64_t n) {
    v.fetch_add(n, std::memory_order_relaxed);
    return true;
  }
  static bool TryCharge(std::atomic<int64_t>& v, int64_t n, int64_t max) {
    int64_t cur = v.load(std::memory_order_relaxed);
    do {
      if (n > max - cur) return false;
    } while (!v.compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
    return true;
  }

  const int64_t max_caches_;
  const int64_t max_pages_;
  ByteBudget metadata_;
  std::atomic<int64_t> caches_{0};
  std::atomic<int64_t> pages_{0};
};

}  // namespace kvarena

#endif  // KVARENA_CORE_QUOTA_H_
