#include "client/scratch_lanes.h"

#include <algorithm>
#include <utility>

#include "kvarena/paged_kv.h"

namespace kvarena::client_internal {
namespace {
constexpr size_t kAlign = 64;
}  // namespace

size_t ScratchLanes::Footprint(size_t bytes) { return RoundUp(bytes, kAlign); }

bool ScratchLanes::HandlerFinished(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kUnauthenticated:
      return true;
    default:
      return false;
  }
}

ScratchLanes::ScratchLanes(uint64_t region_id, uint8_t* base, size_t size, int num_lanes)
    : region_id_(region_id),
      base_(base),
      lane_bytes_(num_lanes > 0 ? size / size_t(num_lanes) / kAlign * kAlign : 0) {
  absl::MutexLock lock(&mu_);
  for (int i = num_lanes - 1; i >= 0 && lane_bytes_ > 0; --i) free_.push_back(i);
}

ScratchLanes::Lease ScratchLanes::Acquire() {
  Lease lease;
  absl::MutexLock lock(&mu_);
  if (free_.empty()) return lease;
  lease.owner_ = this;
  lease.lane_ = free_.back();
  free_.pop_back();
  lease.offset_ = size_t(lease.lane_) * lane_bytes_;
  lease.size_ = lane_bytes_;
  return lease;
}

std::vector<int> ScratchLanes::quarantined() const {
  absl::MutexLock lock(&mu_);
  return quarantined_;
}

void ScratchLanes::Release(int lane, bool reuse) {
  absl::MutexLock lock(&mu_);
  (reuse ? free_ : quarantined_).push_back(lane);
}

void ScratchLanes::Lease::Return() {
  if (owner_ == nullptr) return;
  // Untouched, the lane was named by no request; else only a settled, finished call frees it.
  const bool reuse = !taken_ || (settled_ && finished_);
  std::exchange(owner_, nullptr)->Release(lane_, reuse);
}

ScratchLanes::Lease& ScratchLanes::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    Return();
    owner_ = std::exchange(o.owner_, nullptr);
    lane_ = o.lane_;
    offset_ = o.offset_;
    size_ = o.size_;
    used_ = o.used_;
    taken_ = o.taken_;
    settled_ = o.settled_;
    finished_ = o.finished_;
  }
  return *this;
}

ScratchLanes::Lease::~Lease() { Return(); }

uint8_t* ScratchLanes::Lease::Take(size_t bytes, v1::SharedSlice* slice) {
  if (owner_ == nullptr || bytes > room()) return nullptr;
  const size_t at = offset_ + used_;
  used_ += std::min(room(), Footprint(bytes));
  taken_ = true;
  slice->set_region_id(owner_->region_id_);
  slice->set_offset(at);
  slice->set_length(bytes);
  return owner_->base_ + at;
}

void ScratchLanes::Lease::Settle(const absl::Status& call) {
  settled_ = true;
  finished_ = HandlerFinished(call.code());
}

}  // namespace kvarena::client_internal
