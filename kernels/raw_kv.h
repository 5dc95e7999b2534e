// ReadRawKv: positions of one layer as its pages store them — a quantized format's codes
// and scales — for GetKv's raw replies (core) and get_kv_local's (client). The pages come
// to host memory through KvKernels::ReadPages, so a device pool reads the same way.
#ifndef KVARENA_KERNELS_RAW_KV_H_
#define KVARENA_KERNELS_RAW_KV_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "kernels/kv_kernels.h"
#include "kernels/paged_kv.h"
#include "kvarena/types.h"

namespace kvarena {

// The bytes a raw GetKv reply of n tokens carries beyond kGetKvReplyEnvelopeBytes (the
// framing of k and v): K and V codes and scales, and kRawScalesFraming for the two scale
// tensors' own framing. nullopt past 2^64.
inline constexpr uint64_t kRawScalesFraming = 128;
std::optional<uint64_t> RawKvBytes(const PageLayout& layout, int64_t n);

// Sets r->k, r->v, r->kv_format, r->k_scales and r->v_scales for positions [pos, pos + n)
// as GetKvResult states their raw form; first_pos and layer_len are the caller's.
// REQUIRES: the view holds [pos, pos + n) (the caller validated it).
absl::Status ReadRawKv(KvKernels& kernels, const PagedKvView& view, int64_t pos, int64_t n,
                       GetKvResult* r);

}  // namespace kvarena

#endif  // KVARENA_KERNELS_RAW_KV_H_
