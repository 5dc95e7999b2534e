// KvCache's reads of K/V: Attend (with its optional append: append, then attend the new
// queries over past + new) and GetKv (kv_cache.h).
#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/kv_cache.h"
#include "core/refusal.h"
#include "core/validate.h"
#include "kernels/raw_kv.h"
#include "kernels/stop_token.h"

namespace kvarena {
absl::StatusOr<AttendResult> KvCache::Attend(const AttendArgs& args, void* out, size_t out_bytes,
                                             const StopToken* stop) {
  absl::MutexLock lock(&mu_);
  // A call that waited for the lock past its deadline, or whose caller left, starts nothing.
  if (stop != nullptr && stop->Poll()) return stop->status("attend: ");
  const int layer = args.layer;
  KVARENA_RETURN_IF_ERROR(CheckLayerLocked("attend", layer));
  const TensorArg& q = args.q;
  KVARENA_ASSIGN_OR_RETURN(int64_t n,
                           CheckQuery("attend", spec_, q, out, out_bytes, args.scale, limits()));
  const int64_t q_heads = q.shape[1];
  const bool has_k = Present(args.k), has_v = Present(args.v);
  if (has_k != has_v) {
    return absl::InvalidArgumentError(
        absl::StrCat("attend: ", has_k ? "k" : "v", " given without ", has_k ? "v" : "k"));
  }
  const LayerTable& t = layers_[size_t(layer)];
  const int64_t window = EffectiveWindow(spec_.layer_windows[size_t(layer)], args.window);
  const int64_t old_seq = SeqLenLocked();
  const int64_t old_mat = MaterializedLocked();
  Taken added;
  if (!has_k) {
    // Written so it cannot wrap: pos + n <= len.
    if (args.pos < 0 || args.pos > t.len() - n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attend: pos=", args.pos, " with ", n, " queries needs positions up to pos + ", n,
          " but layer ", layer, " holds ", t.len(), " tokens (pass k and v to append)"));
    }
    const int64_t need = window > 0 ? std::max<int64_t>(0, args.pos - window + 1) : 0;
    if (need < t.first_pos(spec_.page_size)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "attend: query at pos=", args.pos, " needs keys from position ", need, " but layer ",
          layer, " evicted everything below ", t.first_pos(spec_.page_size), " (window ",
          spec_.layer_windows[size_t(layer)], ")"));
    }
  }
  // The last query sees keys up to pos + n (no overflow: checked above, or pos is the
  // layer's length; any other pos with k/v is AppendLocked's INVALID_ARGUMENT).
  if (!has_k || args.pos == t.len()) {
    if (absl::Status s = CheckAttendWork("attend", n, args.pos + n, window, q_heads, limits());
        !s.ok()) {
      CountRefusal();
      return s;
    }
  }
  if (has_k) {
    if (args.k.shape.size() == 4 && args.k.shape[2] != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("attend: q has ", n, " tokens but k has ", args.k.shape[2]));
    }
    KVARENA_ASSIGN_OR_RETURN(Taken appended,
                             AppendLocked("attend", layer, args.pos, args.k, args.v));
    added = std::move(appended);
  }
  AttentionParams p;
  p.num_q_heads = int(q_heads);
  p.q_pos = args.pos;
  p.n = n;
  p.scale = AttentionScale(args.scale, spec_.head_dim);
  p.window = window;
  p.stop = stop;
  if (absl::Status s = kernels().PagedAttention(ViewLocked(layer), p, q.data, out); !s.ok()) {
    // All or nothing: the tokens this call appended go too.
    if (has_k) UndoAppendLocked(layer, args.pos, added);
    const bool stopped = absl::IsCancelled(s) || absl::IsDeadlineExceeded(s);
    return absl::Status(stopped ? s.code() : absl::StatusCode::kInternal,
                        absl::StrCat("attend: layer ", layer, ": ", s.message()));
  }
  if (has_k) {
    RegisterLocked(layer);
    EvictLocked(layer, args.pos);
  }
  PublishLocked(old_seq, old_mat);
  return AttendResult{q.shape, SeqLenLocked()};
}

absl::StatusOr<GetKvResult> KvCache::GetKv(int layer, const GetKvRange& range) {
  absl::MutexLock lock(&mu_);
  KVARENA_RETURN_IF_ERROR(CheckLayerLocked("get_kv", layer));
  if (range.from_pos < 0 || range.max_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("get_kv: from_pos=", range.from_pos,
                                                   " and max_tokens=", range.max_tokens,
                                                   " must be >= 0"));
  }
  const LayerTable& t = layers_[size_t(layer)];
  const int64_t first = std::min(std::max(range.from_pos, t.first_pos(spec_.page_size)), t.len());
  int64_t n = t.len() - first;
  if (range.max_tokens > 0) n = std::min(n, range.max_tokens);
  // A quantized cache's raw reply: its codes and scales; any other answers with values.
  const PageLayout& layout = ctx_.pool->layout();
  const bool raw = range.raw && layout.format() != NativeKvFormat(spec_.dtype);
  const std::optional<uint64_t> bytes =
      TensorBytes(spec_.dtype, spec_.num_kv_heads, n, spec_.head_dim);
  const std::optional<uint64_t> raw_bytes = RawKvBytes(layout, n);
  // The K+V bytes a reply may carry: what is left of max_reply_bytes after its envelope.
  const uint64_t kv_budget = ctx_.max_reply_bytes > kGetKvReplyEnvelopeBytes
                                 ? ctx_.max_reply_bytes - kGetKvReplyEnvelopeBytes
                                 : 0;
  if (raw ? !raw_bytes || *raw_bytes > kv_budget : !bytes || *bytes > kv_budget / 2) {
    const uint64_t per_token =
        raw ? 2 * uint64_t(layout.TokenBytes())
            : *TensorBytes(spec_.dtype, spec_.num_kv_heads, 2, spec_.head_dim);
    return RefusedError(
        Refusal::kMaxMessageBytes,
        absl::StrCat("get_kv: layer ", layer, " positions [", first, ", ", first + n, ") are ",
                     uint64_t(n) * per_token, raw ? " raw" : "", " bytes of K and V, above the ",
                     kv_budget, " a reply of ", ctx_.max_reply_bytes,
                     " bytes may carry besides its ", kGetKvReplyEnvelopeBytes,
                     "-byte envelope; ask for at most ", kv_budget / per_token,
                     " tokens at a time (from_pos, max_tokens)"));
  }
  GetKvResult r;
  r.first_pos = first;
  r.layer_len = t.len();
  absl::Status s;
  if (raw) {
    s = ReadRawKv(kernels(), ViewLocked(layer), first, n, &r);
  } else {
    r.kv_format = NativeKvFormat(spec_.dtype);
    for (TensorOut* o : {&r.k, &r.v}) {
      o->dtype = spec_.dtype;
      o->shape = {1, spec_.num_kv_heads, n, spec_.head_dim};
      o->data.resize(size_t(*bytes));
    }
    if (n > 0)
      s = kernels().GatherKv(ViewLocked(layer), first, n, r.k.data.data(), r.v.data.data());
  }
  if (!s.ok()) return absl::InternalError(absl::StrCat("get_kv: layer ", layer, ": ", s.message()));
  return r;
}

}  // namespace kvarena
