// RemoteTransport's calls that carry tensors (client/remote_transport.h): Append (k, v)
// and Attend (q, optional k and v, out). A call leases one scratch lane for all of its
// tensors (ZeroCopy::Lease) or sends them all inline when it gets none, and settles the
// lane with its status, so a lane whose handler may still run is quarantined
// (client/scratch_lanes.h). Tensors that go inline make the request at least their bytes:
// a call whose inline tensors alone pass the message limit is refused before they are
// copied into it (the channel then checks the whole request, as for every call). Kept
// apart because the lease's lifetime around the call is the one rule here that the
// field-only calls do not have.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/remote_transport.h"
#include "client/scratch_lanes.h"
#include "client/zero_copy.h"
#include "core/validate.h"
#include "kvarena/v1/kvarena.grpc.pb.h"
#include "proto/wire.h"

namespace kvarena::client_internal {

absl::Status RemoteTransport::InlineFits(const char* request,
                                         std::initializer_list<const TensorArg*> tensors) const {
  size_t bytes = 0;
  for (const TensorArg* t : tensors) {
    if (Present(*t) && __builtin_add_overflow(bytes, t->bytes, &bytes)) bytes = SIZE_MAX;
  }
  return channel_.CheckRequestSize(absl::StrCat(request, "'s inline tensors alone"), bytes);
}

absl::StatusOr<AppendResult> RemoteTransport::Append(const std::string& cache_id, int layer,
                                                     int64_t pos, const TensorArg& k,
                                                     const TensorArg& v) {
  if (forked()) return DisconnectedStatus();  // the scratch lanes are the parent's
  ScratchLanes::Lease lease = zero_copy_->Lease({k.bytes, v.bytes});
  if (!lease) {
    KVARENA_RETURN_IF_ERROR(InlineFits("AppendRequest", {&k, &v}));
  }
  v1::AppendRequest req;
  req.set_cache_id(cache_id);
  req.set_layer(layer);
  req.set_pos(pos);
  ZeroCopy::EncodeTensor(k, &lease, req.mutable_k());
  ZeroCopy::EncodeTensor(v, &lease, req.mutable_v());
  v1::AppendResponse resp;
  absl::Status s = channel_.Call(&Stub::Append, req, &resp);
  lease.Settle(s);
  KVARENA_RETURN_IF_ERROR(s);
  AppendResult r;
  r.layer_len = int64_t(resp.layer_len());
  r.seq_len = int64_t(resp.seq_len());
  return r;
}

absl::StatusOr<AttendResult> RemoteTransport::Attend(const AttendArgs& args, TensorOut* out) {
  if (forked()) return DisconnectedStatus();  // the scratch lanes are the parent's
  // q, k, v and out all through one lane, or all inline.
  ScratchLanes::Lease lease =
      zero_copy_->Lease({args.q.bytes, args.k.bytes, args.v.bytes, args.q.bytes});
  if (!lease) {
    KVARENA_RETURN_IF_ERROR(InlineFits("AttendRequest", {&args.q, &args.k, &args.v}));
  }
  v1::AttendRequest req;
  req.set_cache_id(args.cache_id);
  req.set_layer(args.layer);
  req.set_pos(args.pos);
  ZeroCopy::EncodeTensor(args.q, &lease, req.mutable_q());
  // Absent k and v (attend over the cache) stay unset on the wire.
  if (Present(args.k)) ZeroCopy::EncodeTensor(args.k, &lease, req.mutable_k());
  if (Present(args.v)) ZeroCopy::EncodeTensor(args.v, &lease, req.mutable_v());
  v1::SharedSlice out_slice;
  const uint8_t* shared_out = lease ? lease.Take(args.q.bytes, &out_slice) : nullptr;
  if (shared_out != nullptr) *req.mutable_out() = out_slice;
  req.set_scale(args.scale);
  req.set_window(args.window);
  v1::AttendResponse resp;
  absl::Status s = channel_.Call(&Stub::Attend, req, &resp);
  lease.Settle(s);
  KVARENA_RETURN_IF_ERROR(s);
  *out = TensorOutFromProto(resp.out());
  if (shared_out != nullptr) {
    out->data.assign(reinterpret_cast<const char*>(shared_out), args.q.bytes);
  }
  AttendResult r;
  r.out_shape = out->shape;
  r.seq_len = int64_t(resp.seq_len());
  return r;
}

}  // namespace kvarena::client_internal
