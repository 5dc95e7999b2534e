// ByteBudget: a limit on bytes that many owners charge against — the arena's committed
// chunks (--arena_bytes), or the daemon's bookkeeping (--metadata_bytes: caches' tables,
// declared token ids, prefix-index nodes). A budget may sit inside a parent (a session's
// share of the daemon's metadata): a charge takes bytes from both or from neither.
// BudgetCharge: what one owner holds of a budget, given back when it goes.
//
// Thread-safety: ByteBudget is safe for concurrent use (a charge never overshoots the
// limit). A BudgetCharge is guarded by its owner.
#ifndef KVARENA_CORE_BYTE_BUDGET_H_
#define KVARENA_CORE_BYTE_BUDGET_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvarena {

class ByteBudget {
 public:
  // `name` labels refusals ("metadata_bytes"); parent (may be null) outlives this budget.
  explicit ByteBudget(size_t limit, ByteBudget* parent = nullptr, std::string name = "")
      : limit_(limit), parent_(parent), name_(std::move(name)) {}
  ByteBudget(const ByteBudget&) = delete;
  ByteBudget& operator=(const ByteBudget&) = delete;

  // Charges `bytes` if they fit under this limit and the parent's; false (nothing
  // charged) otherwise.
  bool TryCharge(size_t bytes) {
    size_t used = used_.load(std::memory_order_relaxed);
    do {
      if (bytes > limit_ - used) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    if (parent_ != nullptr && !parent_->TryCharge(bytes)) {
      used_.fetch_sub(bytes, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  void Refund(size_t bytes) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    if (parent_ != nullptr) parent_->Refund(bytes);
  }
  size_t used() const { return used_.load(std::memory_order_relaxed); }
  size_t limit() const { return limit_; }
  const ByteBudget* parent() const { return parent_; }
  // What a charge may take now: the least room of this budget and its parents.
  size_t available() const {
    const size_t own = limit_ - used();
    return parent_ == nullptr ? own : std::min(own, parent_->available());
  }
  // "N of NAME=LIMIT are free", for the budget (this or a parent) with the least room.
  std::string Describe() const {
    if (parent_ != nullptr && parent_->available() <= limit_ - used()) return parent_->Describe();
    return absl::StrCat(limit_ - used(), " of ", name_, "=", limit_, " are free");
  }

 private:
  const size_t limit_;
  ByteBudget* const parent_;
  const std::string name_;
  std::atomic<size_t> used_{0};
};

// Bytes held against a budget (none without one); the destructor gives them back.
class BudgetCharge {
 public:
  BudgetCharge() = default;
  explicit BudgetCharge(ByteBudget* budget) : budget_(budget) {}
  ~BudgetCharge() {
    if (budget_ != nullptr) budget_->Refund(bytes_);
  }
  BudgetCharge(BudgetCharge&& o) noexcept
      : budget_(std::exchange(o.budget_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  BudgetCharge& operator=(BudgetCharge&&) = delete;
  BudgetCharge(const BudgetCharge&) = delete;

  // Holds exactly `bytes` from now on: charges or refunds the difference. False, nothing
  // changed, when a larger charge does not fit.
  bool Resize(size_t bytes) {
    if (budget_ != nullptr) {
      if (bytes > bytes_ && !budget_->TryCharge(bytes - bytes_)) return false;
      if (bytes < bytes_) budget_->Refund(bytes_ - bytes);
    }
    bytes_ = bytes;
    return true;
  }
  size_t bytes() const { return bytes_; }
  ByteBudget* budget() const { return budget_; }

 private:
  ByteBudget* budget_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kvarena

#endif  // KVARENA_CORE_BYTE_BUDGET_H_
