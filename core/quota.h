// Quota: what one session's caches may hold together — a number of caches and of pages,
// and bytes of metadata (its share of the daemon's --metadata_bytes) — charged as caches
// are allocated and take pages or declare tokens, refunded as they give them back. The
// caches allocated without a session share one Quota of the same bounds (one per owner).
//
// A quota may sit inside its owner's (a tenant's max_caches / max_pages /
// max_metadata_bytes, the parent): a charge of caches, pages or metadata takes from both
// or from neither, so an owner's sessions and sessionless caches together stay within the
// owner's bounds. A page is counted once per
// cache that holds it: a prefix page adopted by, or shared through Fork with, several
// caches is charged to each of them.
//
// Thread-safety: safe for concurrent use (atomics; a charge never overshoots its bound:
// each bound's check and charge are one compare-and-swap, so two callers racing for the
// last page cannot both take it).
#ifndef KVARENA_CORE_QUOTA_H_
#define KVARENA_CORE_QUOTA_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/byte_budget.h"
#include "core/refusal.h"

namespace kvarena {

class Quota {
 public:
  // max_pages 0: no page bound. max_metadata_bytes 0: none beyond `metadata`, the budget
  // its charges also take from (the daemon's, or the owner's: parent->metadata(); may be
  // null; it outlives the quota). `parent`: the owner's quota this one sits inside (may
  // be null).
  Quota(int64_t max_caches, int64_t max_pages, size_t max_metadata_bytes = 0,
        ByteBudget* metadata = nullptr, std::shared_ptr<Quota> parent = nullptr,
        std::string metadata_name = "session_metadata_bytes")
      : max_caches_(max_caches),
        max_pages_(max_pages),
        metadata_(max_metadata_bytes == 0 ? std::numeric_limits<size_t>::max() : max_metadata_bytes,
                  metadata, std::move(metadata_name)),
        parent_(std::move(parent)) {}
  // An owner's quota (a tenant's): max_caches / max_pages 0 mean no bound; its metadata,
  // max_metadata_bytes (0: none), sits inside `metadata`. Refusals name it ("tenant 'NAME'").
  static std::shared_ptr<Quota> ForOwner(const std::string& owner, int64_t max_caches,
                                         int64_t max_pages, size_t max_metadata_bytes = 0,
                                         ByteBudget* metadata = nullptr) {
    auto q =
        std::make_shared<Quota>(max_caches == 0 ? std::numeric_limits<int64_t>::max() : max_caches,
                                max_pages, max_metadata_bytes, metadata, nullptr,
                                absl::StrCat("tenant '", owner, "' max_metadata_bytes"));
    q->owner_ = owner;
    return q;
  }
  Quota(const Quota&) = delete;
  Quota& operator=(const Quota&) = delete;

  // Counts one more cache if it fits here and in the parent; false (nothing counted) otherwise.
  bool TryAddCache() {
    if (!TryCharge(caches_, 1, max_caches_)) return false;
    if (parent_ != nullptr && !parent_->TryAddCache()) {
      caches_.fetch_sub(1, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  void RemoveCache() {
    caches_.fetch_sub(1, std::memory_order_relaxed);
    if (parent_ != nullptr) parent_->RemoveCache();
  }
  // Charges n >= 0 pages if they fit here and in the parent; false (nothing charged) otherwise.
  bool TryChargePages(int64_t n) {
    if (!(max_pages_ == 0 ? Add(pages_, n) : TryCharge(pages_, n, max_pages_))) return false;
    if (parent_ != nullptr && !parent_->TryChargePages(n)) {
      pages_.fetch_sub(n, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  void RefundPages(int64_t n) {
    pages_.fetch_sub(n, std::memory_order_relaxed);
    if (parent_ != nullptr) parent_->RefundPages(n);
  }

  // After TryAddCache / TryChargePages(n) failed: the bound that refused, with its holder's
  // numbers — "the session's caches hold 3 of session_max_pages=4" / "the session holds
  // 2 caches; max_caches_per_session=2", or, when the owner's bound refused, "tenant 'a'
  // holds 9 pages; its max_pages=10" / "tenant 'a' holds 3 caches; its max_caches=3" —
  // and the refusal's tag. `self` names this quota's holder ("the session", "the caches
  // without a session").
  std::string DescribePages(int64_t n, absl::string_view self = "the session") const {
    if (const Quota* q = Refuser(n, &Quota::pages_, &Quota::max_pages_); q != this) {
      return absl::StrCat("tenant '", q->owner_, "' holds ", q->pages(),
                          " pages; its max_pages=", q->max_pages_);
    }
    return absl::StrCat(self, "'s caches hold ", pages(), " of session_max_pages=", max_pages_);
  }
  std::string DescribeCaches(absl::string_view self = "the session") const {
    if (const Quota* q = Refuser(1, &Quota::caches_, &Quota::max_caches_); q != this) {
      return absl::StrCat("tenant '", q->owner_, "' holds ", q->caches(),
                          " caches; its max_caches=", q->max_caches_);
    }
    return absl::StrCat(self, " holds ", caches(), " caches; max_caches_per_session=", max_caches_);
  }
  Refusal PagesRefusal(int64_t n) const {
    return Refuser(n, &Quota::pages_, &Quota::max_pages_) == this ? Refusal::kSessionMaxPages
                                                                  : Refusal::kTenantMaxPages;
  }
  Refusal CachesRefusal() const {
    return Refuser(1, &Quota::caches_, &Quota::max_caches_) == this ? Refusal::kMaxCachesPerSession
                                                                    : Refusal::kTenantMaxCaches;
  }

  int64_t caches() const { return caches_.load(std::memory_order_relaxed); }
  int64_t pages() const { return pages_.load(std::memory_order_relaxed); }
  // The session's metadata budget, inside its owner's or the daemon's: what its caches
  // charge.
  ByteBudget* metadata() { return &metadata_; }
  int64_t max_caches() const { return max_caches_; }
  int64_t max_pages() const { return max_pages_; }
  Quota* parent() const { return parent_.get(); }

 private:
  // The first quota from this one up whose bound cannot take n more of `count` (this one
  // when none: a racing refund freed room meanwhile, and this holder is named).
  const Quota* Refuser(int64_t n, std::atomic<int64_t> Quota::*count,
                       const int64_t Quota::*max) const {
    for (const Quota* q = this; q != nullptr; q = q->parent_.get()) {
      if (q->*max != 0 && n > q->*max - (q->*count).load(std::memory_order_relaxed)) return q;
    }
    return this;
  }

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
  const std::shared_ptr<Quota> parent_;
  std::string owner_;  // an owner's quota: the owner it bounds (ForOwner)
  std::atomic<int64_t> caches_{0};
  std::atomic<int64_t> pages_{0};
};

}  // namespace kvarena

#endif  // KVARENA_CORE_QUOTA_H_
