#include "client/scratch_lanes.h"

#include <algorithm>
#include <utility>

namespace kvarena::client_internal {
namespace {
constexpr size_t kAlign = 64;
}  // namespace

size_t ScratchLanes::Footprint(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

ScratchLanes::ScratchLanes(uint64_t region_id, uint8_t* base, size_t size, int num_lanes)
    : region_id_(region_id),
      base_(base),
      lane_bytes_(num_lanes > 0 ? size / size_t(num_lanes) / kAlign * kAlign : 0) {
  for (int i = num_lanes - 1; i >= 0 && lane_bytes_ > 0; --i) free_.push_back(i);
}

ScratchLanes::Lease ScratchLanes::Acquire() {
  Lease lease;
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return lease;
  lease.owner_ = this;
  lease.lane_ = free_.back();
  free_.pop_back();
  lease.offset_ = size_t(lease.lane_) * lane_bytes_;
  lease.size_ = lane_bytes_;
  return lease;
}

void ScratchLanes::Release(int lane) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(lane);
}

ScratchLanes::Lease& ScratchLanes::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    if (owner_ != nullptr) owner_->Release(lane_);
    owner_ = std::exchange(o.owner_, nullptr);
    lane_ = o.lane_;
    offset_ = o.offset_;
    size_ = o.size_;
    used_ = o.used_;
  }
  return *this;
}

ScratchLanes::Lease::~Lease() {
  if (owner_ != nullptr) owner_->Release(lane_);
}

uint8_t* ScratchLanes::Lease::Take(size_t bytes, v1::SharedSlice* slice) {
  if (owner_ == nullptr || bytes > room()) return nullptr;
  const size_t at = offset_ + used_;
  used_ += std::min(room(), Footprint(bytes));
  slice->set_region_id(owner_->region_id_);
  slice->set_offset(at);
  slice->set_length(bytes);
  return owner_->base_ + at;
}

}  // namespace kvarena::client_internal
