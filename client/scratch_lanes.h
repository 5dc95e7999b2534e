// ScratchLanes: the session's scratch region (shared with the daemon) cut into equal lanes,
// so concurrent calls never share bytes. A call leases one lane, bump-allocates the slices
// of its tensors in it (q, k, v, out), and gives it back when it has read the reply. When
// no lane is free or a call does not fit in one, the caller sends inline bytes instead:
// never blocks, never fails.
//
// Thread-safety: Acquire is safe for concurrent use (a mutex around the free list); a
// Lease belongs to one thread.
#ifndef KVARENA_CLIENT_SCRATCH_LANES_H_
#define KVARENA_CLIENT_SCRATCH_LANES_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "kvarena/v1/kvarena.pb.h"

namespace kvarena::client_internal {

class ScratchLanes {
 public:
  // base/size: the scratch region as mapped here, region_id its id on the wire.
  ScratchLanes(uint64_t region_id, uint8_t* base, size_t size, int num_lanes);
  ScratchLanes(const ScratchLanes&) = delete;
  ScratchLanes& operator=(const ScratchLanes&) = delete;

  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept { *this = std::move(o); }
    Lease& operator=(Lease&& o) noexcept;
    ~Lease();

    explicit operator bool() const { return owner_ != nullptr; }
    // Bytes left in the lane.
    size_t room() const { return size_ - used_; }
    // `bytes` of the lane (64-byte aligned), described as a slice of the scratch region;
    // null when they do not fit.
    uint8_t* Take(size_t bytes, v1::SharedSlice* slice);

   private:
    friend class ScratchLanes;
    ScratchLanes* owner_ = nullptr;
    int lane_ = -1;
    size_t offset_ = 0;  // of the lane in the region
    size_t size_ = 0;
    size_t used_ = 0;
  };

  // A free lane, or an empty lease when every lane is in use.
  Lease Acquire();
  // What Take(bytes) uses of a lane (bytes rounded up to the alignment).
  static size_t Footprint(size_t bytes);
  size_t lane_bytes() const { return lane_bytes_; }

 private:
  void Release(int lane);

  const uint64_t region_id_;
  uint8_t* const base_;
  const size_t lane_bytes_;
  std::mutex mu_;
  std::vector<int> free_;  // guarded by mu_
};

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_SCRATCH_LANES_H_
