#include "daemon/call_tensors.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/refusal.h"
#include "proto/wire.h"

namespace kvarena {

absl::StatusOr<ResolvedSlice> CallTensors::Resolve(absl::string_view field,
                                                   const v1::SharedSlice& s) {
  absl::StatusOr<ResolvedSlice> r =
      store_->ResolveSlice(session_, s.region_id(), s.offset(), s.length());
  if (!r.ok()) return Annotated(r.status(), absl::StrCat(field, ": "));
  held_.push_back(*r);
  return r;
}

absl::StatusOr<TensorArg> CallTensors::In(absl::string_view field, const v1::Tensor& t) {
  TensorArg arg = FromProto(t);  // inline bytes, or none
  if (t.payload_case() == v1::Tensor::kShared) {
    KVARENA_ASSIGN_OR_RETURN(ResolvedSlice r, Resolve(field, t.shared()));
    arg.data = r.data;
    arg.bytes = r.bytes;
  }
  return arg;
}

absl::StatusOr<void*> CallTensors::Out(const v1::AttendRequest& req, const TensorArg& q,
                                       v1::Tensor* reply, size_t* bytes) {
  reply->mutable_shape()->Assign(q.shape.begin(), q.shape.end());
  reply->set_dtype(ToProto(q.dtype));
  if (!req.has_out()) {
    std::string* data = reply->mutable_data();
    data->resize(q.bytes);
    *bytes = data->size();
    return data->data();
  }
  KVARENA_ASSIGN_OR_RETURN(ResolvedSlice r, Resolve("attend: out", req.out()));
  *reply->mutable_shared() = req.out();
  *bytes = r.bytes;
  return r.data;
}

}  // namespace kvarena
