#include "core/validate.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvarena {
namespace {

// Generous bounds that keep every size computation far from overflow.
constexpr int kMaxLayers = 4096;
constexpr int kMaxKvHeads = 1024;
constexpr int kMaxHeadDim = 1024;
constexpr int kMaxPageSize = 4096;

absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(what); }

absl::Status CheckRange(absl::string_view field, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return Bad(absl::StrCat("allocate: spec.", field, "=", value, " must be in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CacheSpec> ResolveSpec(const CacheSpec& spec, int default_page_size) {
  CacheSpec s = spec;
  if (absl::Status st = CheckRange("num_layers", s.num_layers, 1, kMaxLayers); !st.ok()) return st;
  if (absl::Status st = CheckRange("num_kv_heads", s.num_kv_heads, 1, kMaxKvHeads); !st.ok()) return st;
  if (absl::Status st = CheckRange("head_dim", s.head_dim, 1, kMaxHeadDim); !st.ok()) return st;
  if (s.dtype != DType::kFloat32 && s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16) {
    return Bad(absl::StrCat("allocate: spec.dtype=", int(s.dtype),
                            " must be FLOAT32, FLOAT16 or BFLOAT16"));
  }
  if (s.page_size == 0) s.page_size = default_page_size;
  if (absl::Status st = CheckRange("page_size", s.page_size, 1, kMaxPageSize); !st.ok()) return st;
  if (s.layer_windows.empty()) s.layer_windows.assign(size_t(s.num_layers), 0);
  if (int64_t(s.layer_windows.size()) != s.num_layers) {
    return Bad(absl::StrCat("allocate: spec.layer_windows has ", s.layer_windows.size(),
                            " entries but num_layers=", s.num_layers));
  }
  for (size_t i = 0; i < s.layer_windows.size(); ++i) {
    if (s.layer_windows[i] == 1 || s.layer_windows[i] < 0) {
      return Bad(absl::StrCat("allocate: spec.layer_windows[", i, "]=", s.layer_windows[i],
                              " must be 0 (global) or >= 2"));
    }
  }
  if (s.max_tokens < 0) return Bad(absl::StrCat("allocate: spec.max_tokens=", s.max_tokens, " < 0"));
  return s;
}

absl::StatusOr<int64_t> CheckTensor(absl::string_view op, absl::string_view name,
                                    const TensorArg& t, DType dtype, int64_t heads,
                                    int64_t head_dim) {
  if (t.dtype != dtype) {
    return Bad(absl::StrCat(op, ": ", name, ".dtype=", DTypeName(t.dtype), " but the cache holds ",
                            DTypeName(dtype)));
  }
  const std::string shape = absl::StrCat("[", absl::StrJoin(t.shape, ", "), "]");
  if (t.shape.size() != 4 || t.shape[0] != 1 || t.shape[1] != heads || t.shape[3] != head_dim) {
    return Bad(absl::StrCat(op, ": ", name, ".shape=", shape, " must be [1, ", heads,
                            ", tokens, ", head_dim, "]"));
  }
  const int64_t n = t.shape[2];
  if (n < 1 || n > (int64_t{1} << 24)) {
    return Bad(absl::StrCat(op, ": ", name, ".shape=", shape, " has tokens=", n,
                            "; must be in [1, 16777216]"));
  }
  const uint64_t want = uint64_t(heads) * uint64_t(n) * uint64_t(head_dim) * DTypeSize(dtype);
  if (t.bytes != want || t.data == nullptr) {
    return Bad(absl::StrCat(op, ": ", name, " has ", t.bytes, " bytes but shape ", shape, " of ",
                            DTypeName(dtype), " needs ", want));
  }
  return n;
}

absl::StatusOr<int64_t> CheckQuery(absl::string_view op, const CacheSpec& spec, const TensorArg& q,
                                   const void* out, size_t out_bytes, double scale) {
  const int64_t q_heads = q.shape.size() == 4 ? q.shape[1] : 0;
  if (q_heads < 1 || q_heads % spec.num_kv_heads != 0) {
    return Bad(absl::StrCat(
        op, ": q.shape=[", absl::StrJoin(q.shape, ", "), "] must be [1, q_heads, tokens, ",
        spec.head_dim, "] with q_heads a multiple of num_kv_heads=", spec.num_kv_heads));
  }
  absl::StatusOr<int64_t> n = CheckTensor(op, "q", q, spec.dtype, q_heads, spec.head_dim);
  if (!n.ok()) return n.status();
  if (out_bytes != q.bytes || out == nullptr) {
    return Bad(absl::StrCat(op, ": out has ", out_bytes, " bytes but q needs ", q.bytes));
  }
  if (!std::isfinite(scale) || scale < 0) {
    return Bad(absl::StrCat(op, ": scale=", scale, " must be finite and >= 0"));
  }
  return n;
}

}  // namespace kvarena
