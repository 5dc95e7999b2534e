// Boundary checks for specs and tensors, run before any state is touched. Each failure is
// INVALID_ARGUMENT with a message naming the operation, the field and the numbers.
// Pure functions; thread-safe.
#ifndef KVARENA_CORE_VALIDATE_H_
#define KVARENA_CORE_VALIDATE_H_

#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/types.h"

namespace kvarena {

// Checks a spec and fills its defaults: page_size 0 -> default_page_size, an empty
// layer_windows -> all global.
absl::StatusOr<CacheSpec> ResolveSpec(const CacheSpec& spec, int default_page_size);

// Checks that t is a [1, heads, n, head_dim] tensor of `dtype` whose byte count matches,
// with n >= 1, and returns n. `op` and `name` label the message: "append: k: ...".
absl::StatusOr<int64_t> CheckTensor(absl::string_view op, absl::string_view name,
                                    const TensorArg& t, DType dtype, int64_t heads,
                                    int64_t head_dim);

// Checks an attention query for a cache of `spec` (resolved): q is [1, q_heads, n,
// head_dim] in the cache's dtype with q_heads a multiple of num_kv_heads; out is non-null
// and exactly q.bytes long; scale is finite and >= 0. Returns n. Shared by the served
// Attend and the client's local path so both refuse the same calls with the same words.
absl::StatusOr<int64_t> CheckQuery(absl::string_view op, const CacheSpec& spec, const TensorArg& q,
                                   const void* out, size_t out_bytes, double scale);

// The window an attention call applies on a layer: the narrower of the layer's window and
// the call's (0 = none on either side).
inline int64_t EffectiveWindow(int layer_window, uint32_t call_window) {
  if (layer_window == 0) return call_window;
  if (call_window == 0) return layer_window;
  return layer_window < int64_t(call_window) ? layer_window : int64_t(call_window);
}

// Whether a tensor argument was given at all (data or bytes present).
inline bool Present(const TensorArg& t) { return t.data != nullptr || t.bytes != 0 || !t.shape.empty(); }

}  // namespace kvarena

#endif  // KVARENA_CORE_VALIDATE_H_
