// GenericKvCacheHandle::get_kv: a layer read through GetKv ranges, each reply at most
// Transport::get_kv_chunk_bytes() of K+V, concatenated per head into one
// [1, kv_heads, tokens, head_dim] pair (contract: kvarena/kv_cache_handle.h).
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/transport.h"
#include "kvarena/kv_cache_handle.h"

namespace kvarena {

absl::StatusOr<GetKvResult> GenericKvCacheHandle::get_kv(int layer) const {
  KVARENA_RETURN_IF_ERROR(CheckUsable("get_kv"));
  KVARENA_RETURN_IF_ERROR(CheckLayer("get_kv", layer));
  const PageLayout l = layout();
  const size_t row = size_t(l.head_dim) * l.ActivationBytes();  // one head of one token
  const int64_t chunk = std::max<int64_t>(
      1, int64_t(transport_->get_kv_chunk_bytes() / (2 * size_t(l.num_kv_heads) * row)));
  // A chunk above the arena's reply limit: this client's limit is above the daemon's.
  auto failed = [&](const absl::Status& s) {
    if (!absl::IsResourceExhausted(s)) return Observe(s);
    return absl::ResourceExhaustedError(absl::StrCat(
        s.message(), " (get_kv asks for ", chunk,
        " tokens at a time, from ClientOptions::max_message_bytes: set that to at most the "
        "daemon's --max_message_bytes)"));
  };
  auto first = transport_->GetKv(cache_id(), layer, GetKvRange{0, chunk});
  if (!first.ok()) return failed(first.status());
  const int64_t got = first->k.shape.size() == 4 ? first->k.shape[2] : 0;
  // Done when the first chunk reaches the end (a daemon older than paging sends the whole
  // layer and no layer_len: that is the end too).
  if (first->layer_len <= first->first_pos + got) return first;

  const int64_t end = first->layer_len, total = end - first->first_pos;
  const int heads = l.num_kv_heads;
  GetKvResult r;
  r.first_pos = first->first_pos;
  r.layer_len = end;
  for (TensorOut* o : {&r.k, &r.v}) {
    o->dtype = l.dtype;
    o->shape = {1, heads, total, l.head_dim};
    o->data.resize(size_t(heads) * size_t(total) * row);
  }
  // Copies a chunk of n tokens at position `at` into the result, head by head (the token
  // axis is not the outermost).
  auto place = [&](const GetKvResult& c, int64_t at, int64_t n) -> absl::Status {
    const size_t bytes = size_t(heads) * size_t(n) * row;
    if (c.k.data.size() != bytes || c.v.data.size() != bytes) {
      return absl::InternalError(absl::StrCat(
          "get_kv: cache ", cache_id(), " layer ", layer, " chunk at ", at, " of ", n,
          " tokens carries ", c.k.data.size(), "/", c.v.data.size(), " bytes, want ", bytes));
    }
    const size_t offset = size_t(at - r.first_pos) * row;
    for (int h = 0; h < heads; ++h) {
      const size_t src = size_t(h) * size_t(n) * row;
      const size_t dst = size_t(h) * size_t(total) * row + offset;
      std::memcpy(r.k.data.data() + dst, c.k.data.data() + src, size_t(n) * row);
      std::memcpy(r.v.data.data() + dst, c.v.data.data() + src, size_t(n) * row);
    }
    return absl::OkStatus();
  };
  KVARENA_RETURN_IF_ERROR(place(*first, r.first_pos, got));
  for (int64_t at = r.first_pos + got; at < end;) {
    auto c = transport_->GetKv(cache_id(), layer, GetKvRange{at, std::min(chunk, end - at)});
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
