#include "client/zero_copy.h"

#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/wire.h"

namespace kvarena::client_internal {
namespace {

// Lanes the scratch region is cut into: calls in flight at once that go zero-copy.
constexpr int kScratchLanes = 8;

}  // namespace

std::unique_ptr<ZeroCopy> ZeroCopy::Connect(const std::string& address,
                                            const std::string& fd_socket,
                                            const std::string& session, bool inline_tensors) {
  if (fd_socket.empty()) {
    return std::make_unique<ZeroCopy>(
        "the daemon serves no fd socket (--fd_socket=none, or no unix: listener)");
  }
  if (!absl::StartsWith(address, "unix:")) {
    return std::make_unique<ZeroCopy>(
        "pools are shared over the daemon's fd socket, which a client uses only when it "
        "connects over a unix: address");
  }
  absl::StatusOr<std::unique_ptr<RegionClient>> regions = RegionClient::Connect(fd_socket, session);
  if (!regions.ok()) {
    return std::make_unique<ZeroCopy>(
        absl::StrCat("cannot use the fd socket ", fd_socket, ": ", regions.status().message()));
  }
  std::unique_ptr<ZeroCopy> z(new ZeroCopy());
  z->regions_ = *std::move(regions);
  if (!inline_tensors) {
    if (absl::StatusOr<RegionClient::Scratch> s = z->regions_->GetScratch(); s.ok()) {
      z->lanes_ = std::make_unique<ScratchLanes>(s->region_id, s->base, s->size, kScratchLanes);
    }
  }
  return z;
}

absl::Status ZeroCopy::SyncPools() {
  return regions_ != nullptr ? regions_->SyncPools() : absl::OkStatus();
}

absl::StatusOr<RegionClient::Pool> ZeroCopy::GetPool(uint64_t pool_id,
                                                     const std::string& daemon_address) {
  if (regions_ != nullptr) return regions_->GetPool(pool_id);
  return absl::FailedPreconditionError(absl::StrCat(
      "pool ", pool_id, " lives in the daemon at ", daemon_address,
      " and is not mapped into this process: ", status_.message(), "; read K/V with get_kv()"));
}

ScratchLanes::Lease ZeroCopy::Lease(std::initializer_list<size_t> sizes) {
  if (lanes_ == nullptr) return {};
  size_t need = 0;
  for (size_t bytes : sizes) need += ScratchLanes::Footprint(bytes);
  if (need > lanes_->lane_bytes()) return {};
  return lanes_->Acquire();
}

int ZeroCopy::QuarantinedLanes() const {
  return lanes_ != nullptr ? int(lanes_->quarantined().size()) : 0;
}

bool ZeroCopy::EncodeTensor(const TensorArg& t, ScratchLanes::Lease* lease, v1::Tensor* p) {
  uint8_t* dst = nullptr;
  if (*lease && t.data != nullptr) dst = lease->Take(t.bytes, p->mutable_shared());
  if (dst == nullptr) {
    ToProto(t, p);
    return false;
  }
  p->mutable_shape()->Assign(t.shape.begin(), t.shape.end());
  p->set_dtype(ToProto(t.dtype));
  std::memcpy(dst, t.data, t.bytes);
  return true;
}

}  // namespace kvarena::client_internal
