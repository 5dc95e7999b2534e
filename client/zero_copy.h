// ZeroCopy: a remote client's end of the zero-copy data plane for its session — the
// RegionClient that maps the pools (views, local path) and the scratch region cut into
// lanes through which q/k/v/out travel instead of inline bytes.
//
// Used over a unix: address only: the fd socket's path names a file on the daemon's host.
// When the plane cannot be set up the client still works (inline tensors, no mapped
// pools) and GetPool says why.
//
// Thread-safety: Connect before sharing; everything else is safe for concurrent use.
#ifndef KVARENA_CLIENT_ZERO_COPY_H_
#define KVARENA_CLIENT_ZERO_COPY_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/region_client.h"
#include "client/scratch_lanes.h"
#include "core/types.h"
#include "kvarena/v1/kvarena.pb.h"

namespace kvarena::client_internal {

class ZeroCopy {
 public:
  // A plane that maps nothing: every GetPool fails with FAILED_PRECONDITION(why).
  explicit ZeroCopy(std::string why) : status_(absl::FailedPreconditionError(why)) {}
  // address: the gRPC address the client dialled; fd_socket and session from the first
  // AttachEvent. inline_tensors: map the pools but send every tensor inline.
  static std::unique_ptr<ZeroCopy> Connect(const std::string& address, const std::string& fd_socket,
                                           const std::string& session, bool inline_tensors);
  ZeroCopy(const ZeroCopy&) = delete;
  ZeroCopy& operator=(const ZeroCopy&) = delete;

  // Pool pool_id as mapped here; FAILED_PRECONDITION naming the reason when unmapped.
  absl::StatusOr<RegionClient::Pool> GetPool(uint64_t pool_id, const std::string& daemon_address);
  // Maps what the daemon committed to the mapped pools since (RegionClient::SyncPools);
  // OK when nothing is mapped.
  absl::Status SyncPools();
  // A scratch lane with room for tensors of these byte sizes, or an empty lease (inline).
  // The caller settles it with the call's status (ScratchLanes::Lease::Settle).
  ScratchLanes::Lease Lease(std::initializer_list<size_t> sizes);
  // Lanes quarantined so far (0 without lanes).
  int QuarantinedLanes() const;

  // t into *p through the lease's scratch bytes when it has room and t has data, else
  // inline bytes. Returns whether it went through scratch.
  static bool EncodeTensor(const TensorArg& t, ScratchLanes::Lease* lease, v1::Tensor* p);

 private:
  ZeroCopy() = default;

  absl::Status status_;                    // why regions_ is null
  std::unique_ptr<RegionClient> regions_;  // null: pools not mapped
  std::unique_ptr<ScratchLanes> lanes_;    // null: every tensor inline
};

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_ZERO_COPY_H_
