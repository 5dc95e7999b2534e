// Boundary checks for specs and tensors, run before any state is touched. Each failure is
// INVALID_ARGUMENT with a message naming the operation, the field and the numbers (but
// CheckAttendWork's: a RESOURCE_EXHAUSTED refusal). Pure functions; thread-safe.
#ifndef KVARENA_CORE_VALIDATE_H_
#define KVARENA_CORE_VALIDATE_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/types.h"
#include "kernels/kv_kernels.h"

namespace kvarena {

// Documented bounds of a spec (DESIGN.md, "Wire contract": CacheSpec).
inline constexpr int kMaxLayers = 1024;
inline constexpr int kMaxKvHeads = 1024;
inline constexpr int kMaxHeadDim = 1024;
inline constexpr int kMaxPageSize = 4096;
inline constexpr size_t kMaxCacheIdBytes = 256;
// What a GetKv reply holds besides its K and V bytes, at most: the framing of two tensors
// (shape, dtype, length prefixes) and two positions, about 150 bytes as protobuf. A range
// is served when its K+V bytes fit max_reply_bytes less this, so a range of the size a
// refusal advises fits the wire too.
inline constexpr size_t kGetKvReplyEnvelopeBytes = 256;
inline constexpr size_t kMaxPrefixNamespaceBytes = 1024;

// What a request may ask for: the kernels' reach and the store's per-request bound.
struct RequestLimits {
  int64_t max_positions = KernelLimits{}.max_positions;  // positions, lengths, windows, max_tokens
  int max_group = KernelLimits{}.max_group;              // q heads per kv head
  int64_t max_request_tokens = int64_t{1} << 20;         // tokens in one tensor or item
  // queries x keys x q heads of one served Attend (StoreOptions::max_attend_work)
  int64_t max_attend_work = int64_t{1} << 37;
};

// Bytes of a [heads, tokens, head_dim] tensor of dtype; nullopt when a count is negative,
// the dtype has no size, or the product does not fit in 63 bits.
std::optional<uint64_t> TensorBytes(DType dtype, int64_t heads, int64_t tokens, int64_t head_dim);

// The limits for kernels `k` with the store's per-request token bound.
RequestLimits LimitsFor(const KernelLimits& k, int64_t max_request_tokens);

// Checks a spec and fills its defaults: page_size 0 -> default_page_size, an empty
// layer_windows -> all global.
absl::StatusOr<CacheSpec> ResolveSpec(const CacheSpec& spec, int default_page_size,
                                      const RequestLimits& limits);

// Checks that t is a [1, heads, n, head_dim] tensor of `dtype` whose byte count matches,
// with 1 <= n <= limits.max_request_tokens, and returns n. `op` and `name` label the
// message: "append: k: ...".
absl::StatusOr<int64_t> CheckTensor(absl::string_view op, absl::string_view name,
                                    const TensorArg& t, DType dtype, int64_t heads,
                                    int64_t head_dim, const RequestLimits& limits);

// Checks an attention query for a cache of `spec` (resolved): q is [1, q_heads, n,
// head_dim] in the cache's dtype with q_heads a multiple of num_kv_heads, at most
// max_group times it; out is non-null and exactly q.bytes long; scale is finite and >= 0.
// Returns n. Shared by the served Attend and the client's local path so both refuse the
// same calls with the same words.
absl::StatusOr<int64_t> CheckQuery(absl::string_view op, const CacheSpec& spec, const TensorArg& q,
                                   const void* out, size_t out_bytes, double scale,
                                   const RequestLimits& limits);

// Checks that an attention of `queries` queries, the last at position end - 1, over every
// key it may see — all of [0, end), or the last `window` of them when window > 0 — with
// q_heads heads is at most limits.max_attend_work (an upper bound of the keys: evicted
// ones count). Else RESOURCE_EXHAUSTED tagged Refusal::kMaxAttendWork with the product.
absl::Status CheckAttendWork(absl::string_view op, int64_t queries, int64_t end, int64_t window,
                             int64_t q_heads, const RequestLimits& limits);

// Checks token ids a caller declares (Allocate's prompt_tokens, SetTokens' token_ids):
// at most limits.max_request_tokens of them, each >= 0. INVALID_ARGUMENT naming
// "op: field[i]=...".
absl::Status CheckTokenIds(absl::string_view op, absl::string_view field,
                           const std::vector<int32_t>& ids, const RequestLimits& limits);

// Checks that n tokens more fit below limits.max_positions after `len` (n >= 0):
// INVALID_ARGUMENT "op: <what> + n=... passes the largest position ...".
absl::Status CheckGrowth(absl::string_view op, absl::string_view what, int64_t len, int64_t n,
                         const RequestLimits& limits);

// The window an attention call applies on a layer: the narrower of the layer's window and
// the call's (0 = none on either side).
inline int64_t EffectiveWindow(int layer_window, uint32_t call_window) {
  if (layer_window == 0) return call_window;
  if (call_window == 0) return layer_window;
  return layer_window < int64_t(call_window) ? layer_window : int64_t(call_window);
}

// Whether a tensor argument was given at all (data or bytes present).
inline bool Present(const TensorArg& t) {
  return t.data != nullptr || t.bytes != 0 || !t.shape.empty();
}

}  // namespace kvarena

#endif  // KVARENA_CORE_VALIDATE_H_
