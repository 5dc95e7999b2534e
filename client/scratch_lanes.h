// ScratchLanes: the session's scratch region (shared with the daemon) cut into equal lanes,
// so concurrent calls never share bytes. A call leases one lane, bump-allocates the slices
// of its tensors in it (q, k, v, out), sends the request, and settles the lease with the
// call's status once it has read the reply. When no lane is free or a call does not fit in
// one, the caller sends inline bytes instead: never blocks, never fails.
//
// Quarantine. The daemon reads q/k/v from a lane and writes `out` into it inside the
// call's handler, and only there. A lane is safe to hand to the next call once that
// handler has returned, or never ran; HandlerFinished(code) says which statuses prove it:
//   OK, and the codes a kvarenad handler returns after it decoded the request:
//     INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, FAILED_PRECONDITION,
//     OUT_OF_RANGE — the handler returned them, so it is done;
//   RESOURCE_EXHAUSTED — the handler's refusal (arena full, max_tokens), or gRPC's own
//     (a message above a size limit, the server's thread quota), which refuses a call
//     before any handler runs or rejects a reply after the handler returned;
//   UNIMPLEMENTED, UNAUTHENTICATED — gRPC refused the call before any handler ran.
// Every other status quarantines the lane: DEADLINE_EXCEEDED and CANCELLED end the call
// here while a synchronous handler runs on (nothing interrupts it, and it may still read
// q/k/v or write out minutes later); UNAVAILABLE, UNKNOWN, INTERNAL and DATA_LOSS may
// come from a connection that broke mid-call; ABORTED and codes added later are unknown,
// so they are treated alike. A quarantined lane is never leased again for the life of
// this object (the client's), so a straggling handler can only touch bytes no later call
// uses. It costs only its share of the region (lane_bytes()); when every lane is
// quarantined, Acquire returns empty leases and calls go inline: slower, still correct.
// A lease dropped after Take without Settle is quarantined too (a request naming its
// slices may have been sent); one dropped without any Take goes back.
//
// Thread-safety: Acquire and the introspection calls are safe for concurrent use (one
// mutex around the lane lists); a Lease belongs to one thread.
#ifndef KVARENA_CLIENT_SCRATCH_LANES_H_
#define KVARENA_CLIENT_SCRATCH_LANES_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
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
    // Records how the call that named this lane's slices ended: when the lease goes, the
    // lane goes back if HandlerFinished(call.code()), else it is quarantined.
    void Settle(const absl::Status& call);

   private:
    friend class ScratchLanes;
    void Return();  // hands the lane back (or into quarantine) and empties this lease

    ScratchLanes* owner_ = nullptr;
    int lane_ = -1;
    size_t offset_ = 0;  // of the lane in the region
    size_t size_ = 0;
    size_t used_ = 0;
    bool taken_ = false;  // some Take named a slice of the lane
    bool settled_ = false;
    bool finished_ = false;  // settled with a status that proves the handler is done
  };

  // A free lane, or an empty lease when every lane is in use or quarantined.
  Lease Acquire();
  // Whether a call that ended with `code` proves the daemon's handler no longer touches
  // the lane (see the header comment).
  static bool HandlerFinished(absl::StatusCode code);
  // What Take(bytes) uses of a lane (bytes rounded up to the alignment).
  static size_t Footprint(size_t bytes);
  size_t lane_bytes() const { return lane_bytes_; }
  // The quarantined lanes, in the order they were quarantined.
  std::vector<int> quarantined() const;

 private:
  void Release(int lane, bool reuse);

  const uint64_t region_id_;
  uint8_t* const base_;
  const size_t lane_bytes_;
  mutable absl::Mutex mu_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
  std::vector<int> quarantined_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_SCRATCH_LANES_H_
