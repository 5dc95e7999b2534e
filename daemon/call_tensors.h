// CallTensors: the tensors of one Append / Attend call, whatever their payload. Inline
// bytes (Tensor.data) are borrowed from the request; a SharedSlice payload (Tensor.shared,
// AttendRequest.out) names bytes in the caller's own scratch region and is resolved through
// KvStore::ResolveSlice with the call's session. Resolved slices are held until the object
// dies, so the region stays mapped for the whole call even if the session ends meanwhile.
//
// This is the one place the daemon decodes tensor payloads; handlers stay decode -> core
// -> status -> encode. Errors: FAILED_PRECONDITION (no attached session with a scratch
// region), PERMISSION_DENIED (another region), INVALID_ARGUMENT (outside the region), each
// naming the field.
//
// Thread-compatible: one per call, on the handler's thread.
#ifndef KVARENA_DAEMON_CALL_TENSORS_H_
#define KVARENA_DAEMON_CALL_TENSORS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/kv_store.h"
#include "kvarena/v1/kvarena.pb.h"

namespace kvarena {

class CallTensors {
 public:
  // store must outlive this object; session is the call's kvarena-session ("" for none).
  CallTensors(const KvStore* store, std::string session)
      : store_(store), session_(std::move(session)) {}
  CallTensors(const CallTensors&) = delete;
  CallTensors& operator=(const CallTensors&) = delete;

  // A request tensor as core takes it: shape and dtype, and the bytes of its payload
  // (slice.length bytes for a shared one). No payload: data null, bytes 0 ("absent" when
  // the shape is empty too).
  absl::StatusOr<TensorArg> In(absl::string_view field, const v1::Tensor& t);

  // Where Attend writes an output of q's bytes: the request's `out` slice when it has one,
  // else reply->data. Fills reply's shape and dtype from q, and with a slice sets reply's
  // payload to that slice. *bytes is the destination's size (core checks it against q).
  absl::StatusOr<void*> Out(const v1::AttendRequest& req, const TensorArg& q, v1::Tensor* reply,
                            size_t* bytes);

 private:
  absl::StatusOr<ResolvedSlice> Resolve(absl::string_view field, const v1::SharedSlice& s);

  const KvStore* const store_;
  const std::string session_;
  std::vector<ResolvedSlice> held_;  // keeps each resolved region mapped for the call
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_CALL_TENSORS_H_
