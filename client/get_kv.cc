// GenericKvCacheHandle::get_kv: a layer read through GetKv ranges, each reply at most
// Transport::get_kv_chunk_bytes() of K+V, concatenated per head into one
// [1, kv_heads, tokens, head_dim] pair (contract: kvarena/kv_cache_handle.h). A raw read
// concatenates per-token scales [1, kv_heads, tokens] the same way.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/transport.h"
#include "kvarena/kv_cache_handle.h"

namespace kvarena {

absl::StatusOr<GetKvResult> GenericKvCacheHandle::get_kv(int layer, bool raw) const {
  KVARENA_RETURN_IF_ERROR(CheckUsable("get_kv"));
  KVARENA_RETURN_IF_ERROR(CheckLayer("get_kv", layer));
  const PageLayout l = layout();
  raw = raw && l.format() != NativeKvFormat(l.dtype);  // only a quantized cache has codes
  const bool token_scales = raw && ScalesOf(l.format()) == KvScales::kPerToken;
  // Bytes of one head of one token: in k (or v), and in k_scales (or v_scales).
  const size_t row = size_t(l.head_dim) * (raw ? l.ElemBytes() : l.ActivationBytes());
  const size_t scale_row = token_scales ? l.ScaleBytes() / size_t(l.num_kv_heads) : 0;
  const int64_t chunk = std::max<int64_t>(
      1,
      int64_t(transport_->get_kv_chunk_bytes() / (2 * size_t(l.num_kv_heads) * (row + scale_row))));
  // A chunk above the arena's reply limit: this client's limit is above the daemon's.
  auto failed = [&](const absl::Status& s) {
    if (!absl::IsResourceExhausted(s)) return Observe(s);
    return absl::ResourceExhaustedError(absl::StrCat(
        s.message(), " (get_kv asks for ", chunk,
        " tokens at a time, from ClientOptions::max_message_bytes: set that to at most the "
        "daemon's --max_message_bytes)"));
  };
  auto first = transport_->GetKv(cache_id(), layer, GetKvRange{0, chunk, raw});
  if (!first.ok()) return failed(first.status());
  const bool scales_ok =
      !token_scales || (first->k_scales.shape.size() == 3 && first->v_scales.shape.size() == 3);
  if (raw && (first->kv_format != l.format() || !scales_ok)) {  // a daemon older than raw
    return absl::FailedPreconditionError(absl::StrCat(
        "get_kv: cache ", cache_id(), " asked for its raw ", KvFormatName(l.format()),
        " codes and scales, the daemon answered ", KvFormatName(first->kv_format),
        scales_ok ? "" : " without per-token scales", ": it does not serve raw GetKv"));
  }
  const int64_t got = first->k.shape.size() == 4 ? first->k.shape[2] : 0;
  // Done when the first chunk reaches the end (a daemon older than paging sends the whole
  // layer and no layer_len: that is the end too).
  if (first->layer_len <= first->first_pos + got) return first;

  const int64_t end = first->layer_len, total = end - first->first_pos;
  const int heads = l.num_kv_heads;
  GetKvResult r;
  r.first_pos = first->first_pos;
  r.layer_len = end;
  r.kv_format = first->kv_format;
  // The tensors chunks concatenate along tokens, with the bytes of one head of one token.
  std::vector<std::pair<TensorOut GetKvResult::*, size_t>> parts = {{&GetKvResult::k, row},
                                                                    {&GetKvResult::v, row}};
  if (token_scales) {
    parts.push_back({&GetKvResult::k_scales, scale_row});
    parts.push_back({&GetKvResult::v_scales, scale_row});
  } else {  // static scales (or none) are the same in every chunk
    r.k_scales = first->k_scales;
    r.v_scales = first->v_scales;
  }
  for (const auto& [member, bytes] : parts) {
    TensorOut& o = r.*member;
    o.dtype = (first.value().*member).dtype;
    o.shape = (first.value().*member).shape;
    o.shape[2] = total;
    o.data.resize(size_t(heads) * size_t(total) * bytes);
  }
  // Copies a chunk of n tokens at position `at` into the result, head by head (the token
  // axis is not the outermost).
  auto place = [&](const GetKvResult& c, int64_t at, int64_t n) -> absl::Status {
    for (const auto& [member, bytes] : parts) {
      const std::string& in = (c.*member).data;
      std::string& out = (r.*member).data;
      if (in.size() != size_t(heads) * size_t(n) * bytes) {
        return absl::InternalError(absl::StrCat("get_kv: cache ", cache_id(), " layer ", layer,
                                                " chunk at ", at, " of ", n, " tokens carries ",
                                                in.size(), " bytes in a tensor, want ",
                                                size_t(heads) * size_t(n) * bytes));
      }
      for (int h = 0; h < heads; ++h) {
        std::memcpy(out.data() + (size_t(h) * size_t(total) + size_t(at - r.first_pos)) * bytes,
                    in.data() + size_t(h) * size_t(n) * bytes, size_t(n) * bytes);
      }
    }
    return absl::OkStatus();
  };
  KVARENA_RETURN_IF_ERROR(place(*first, r.first_pos, got));
  for (int64_t at = r.first_pos + got; at < end;) {
    auto c = transport_->GetKv(cache_id(), layer, GetKvRange{at, std::min(chunk, end - at), raw});
    if (!c.ok()) return failed(c.status());
    const int64_t n = c->k.shape.size() == 4 ? c->k.shape[2] : 0;
    if (c->first_pos != at || n == 0 || c->layer_len < end) {
      return absl::AbortedError(absl::StrCat("get_kv: cache ", cache_id(), " layer ", layer,
                                             " changed while it was read in chunks of ", chunk,
                                             " tokens: reading [", r.first_pos, ", ", end, ") at ",
                                             at, ", the layer now holds [", c->first_pos, ", ",
                                             c->layer_len, "); read it again"));
    }
    if (n > end - at) {
      return absl::InternalError(absl::StrCat("get_kv: cache ", cache_id(), " layer ", layer,
                                              " asked for at most ", end - at, " tokens at ", at,
                                              " and got ", n));
    }
    KVARENA_RETURN_IF_ERROR(place(*c, at, n));
    at += n;
  }
  return r;
}

}  // namespace kvarena
