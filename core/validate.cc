#include "core/validate.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/checked.h"
#include "base/status_macros.h"
#include "core/refusal.h"

namespace kvarena {
namespace {

absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(what); }

absl::Status CheckRange(absl::string_view field, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return Bad(
        absl::StrCat("allocate: spec.", field, "=", value, " must be in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// k_scales and v_scales: with static scales (KvScales::kPerHead) empty, filled with 1, or
// [num_layers][num_kv_heads] of finite values > 0; without, empty.
absl::Status ResolveStaticScales(CacheSpec* s) {
  const bool takes = ScalesOf(s->kv_format) == KvScales::kPerHead;
  const size_t want = size_t(s->num_layers) * size_t(s->num_kv_heads);  // both checked above
  for (auto [field, scales] :
       {std::pair{"k_scales", &s->k_scales}, std::pair{"v_scales", &s->v_scales}}) {
    if (!takes) {
      if (scales->empty()) continue;
      return Bad(absl::StrCat("allocate: spec.", field, " has ", scales->size(),
                              " entries but spec.kv_format=", KvFormatName(s->kv_format),
                              " takes no static scales (only fp8_e4m3 does)"));
    }
    if (scales->empty()) scales->assign(want, 1.0f);
    if (scales->size() != want) {
      return Bad(absl::StrCat("allocate: spec.", field, " has ", scales->size(),
                              " entries; want 0 or num_layers * num_kv_heads = ", s->num_layers,
                              " * ", s->num_kv_heads, " = ", want));
    }
    for (size_t i = 0; i < scales->size(); ++i) {
      const float x = (*scales)[i];
      if (!(std::isnormal(x) && x > 0)) {
        return Bad(absl::StrCat("allocate: spec.", field, "[", i, "]=", x,
                                " must be a finite, normal float32 > 0"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<uint64_t> TensorBytes(DType dtype, int64_t heads, int64_t tokens, int64_t head_dim) {
  const int64_t elem = int64_t(DTypeSize(dtype));
  if (heads < 0 || tokens < 0 || head_dim < 0 || elem == 0) return std::nullopt;
  std::optional<int64_t> n = CheckedMul(heads, tokens);
  if (n) n = CheckedMul(*n, head_dim);
  if (n) n = CheckedMul(*n, elem);
  if (!n) return std::nullopt;
  return uint64_t(*n);
}

RequestLimits LimitsFor(const KernelLimits& k, int64_t max_request_tokens) {
  RequestLimits l;
  l.max_positions = k.max_positions;
  l.max_group = std::min(k.max_group, KernelLimits{}.max_group);
  l.max_request_tokens = std::min(max_request_tokens, k.max_positions);
  return l;
}

absl::StatusOr<CacheSpec> ResolveSpec(const CacheSpec& spec, int default_page_size,
                                      const RequestLimits& limits) {
  CacheSpec s = spec;
  KVARENA_RETURN_IF_ERROR(CheckRange("num_layers", s.num_layers, 1, kMaxLayers));
  KVARENA_RETURN_IF_ERROR(CheckRange("num_kv_heads", s.num_kv_heads, 1, kMaxKvHeads));
  KVARENA_RETURN_IF_ERROR(CheckRange("head_dim", s.head_dim, 1, kMaxHeadDim));
  if (FindDType(s.dtype) == nullptr) {
    return Bad(absl::StrCat("allocate: spec.dtype=", int(s.dtype),
                            " must be FLOAT32, FLOAT16 or BFLOAT16"));
  }
  s.kv_format = ResolveKvFormat(s.kv_format, s.dtype);
  if (FindKvFormat(s.kv_format) == nullptr) {
    return Bad(absl::StrCat("allocate: spec.kv_format=", int(spec.kv_format),
                            " is not a KV format (kvarena.proto's KvFormat)"));
  }
  if (s.page_size == 0) s.page_size = default_page_size;
  KVARENA_RETURN_IF_ERROR(CheckRange("page_size", s.page_size, 1, kMaxPageSize));
  if (s.layer_windows.empty()) s.layer_windows.assign(size_t(s.num_layers), 0);
  if (int64_t(s.layer_windows.size()) != s.num_layers) {
    return Bad(absl::StrCat("allocate: spec.layer_windows has ", s.layer_windows.size(),
                            " entries but num_layers=", s.num_layers));
  }
  for (size_t i = 0; i < s.layer_windows.size(); ++i) {
    const int64_t w = s.layer_windows[i];
    if (w != 0 && (w < 2 || w > limits.max_positions)) {
      return Bad(absl::StrCat("allocate: spec.layer_windows[", i, "]=", w,
                              " must be 0 (global) or in [2, ", limits.max_positions, "]"));
    }
  }
  KVARENA_RETURN_IF_ERROR(ResolveStaticScales(&s));
  KVARENA_RETURN_IF_ERROR(CheckRange("max_tokens", s.max_tokens, 0, limits.max_positions));
  if (s.prefix_namespace.size() > kMaxPrefixNamespaceBytes) {
    return Bad(absl::StrCat("allocate: spec.prefix_namespace has ", s.prefix_namespace.size(),
                            " bytes; at most ", kMaxPrefixNamespaceBytes));
  }
  return s;
}

absl::Status CheckTokenIds(absl::string_view op, absl::string_view field,
                           const std::vector<int32_t>& ids, const RequestLimits& limits) {
  if (int64_t(ids.size()) > limits.max_request_tokens) {
    return Bad(absl::StrCat(op, ": ", field, " has ", ids.size(), " token ids; at most ",
                            limits.max_request_tokens));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0)
      return Bad(absl::StrCat(op, ": ", field, "[", i, "]=", ids[i], " must be >= 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CheckTensor(absl::string_view op, absl::string_view name,
                                    const TensorArg& t, DType dtype, int64_t heads,
                                    int64_t head_dim, const RequestLimits& limits) {
  if (t.dtype != dtype) {
    return Bad(absl::StrCat(op, ": ", name, ".dtype=", DTypeName(t.dtype), " but the cache holds ",
                            DTypeName(dtype)));
  }
  if (t.shape.size() != 4 || t.shape[0] != 1 || t.shape[1] != heads || t.shape[3] != head_dim) {
    return Bad(absl::StrCat(op, ": ", name, ".shape=", ShapeString(t.shape), " must be [1, ", heads,
                            ", tokens, ", head_dim, "]"));
  }
  const int64_t n = t.shape[2];
  if (n < 1 || n > limits.max_request_tokens) {
    return Bad(absl::StrCat(op, ": ", name, ".shape=", ShapeString(t.shape), " has tokens=", n,
                            "; must be in [1, ", limits.max_request_tokens, "]"));
  }
  // Cannot overflow within the bounds above, but the product is checked like any other.
  const std::optional<uint64_t> want = TensorBytes(dtype, heads, n, head_dim);
  if (!want || t.bytes != *want || t.data == nullptr) {
    return Bad(absl::StrCat(op, ": ", name, " has ", t.bytes, " bytes but shape ",
                            ShapeString(t.shape), " of ", DTypeName(dtype), " needs ",
                            want ? absl::StrCat(*want) : std::string("more than 2^63")));
  }
  return n;
}

absl::StatusOr<int64_t> CheckQuery(absl::string_view op, const CacheSpec& spec, const TensorArg& q,
                                   const void* out, size_t out_bytes, double scale,
                                   const RequestLimits& limits) {
  const int64_t q_heads = q.shape.size() == 4 ? q.shape[1] : 0;
  const int64_t kv = spec.num_kv_heads;
  if (q_heads < 1 || q_heads % kv != 0 || q_heads / kv > limits.max_group) {
    return Bad(absl::StrCat(
        op, ": q.shape=", ShapeString(q.shape), " must be [1, q_heads, tokens, ", spec.head_dim,
        "] with q_heads a multiple of num_kv_heads=", kv, ", at most ", limits.max_group, "x"));
  }
  KVARENA_ASSIGN_OR_RETURN(int64_t n,
                           CheckTensor(op, "q", q, spec.dtype, q_heads, spec.head_dim, limits));
  if (out_bytes != q.bytes || out == nullptr) {
    return Bad(absl::StrCat(op, ": out has ", out_bytes, " bytes but q needs ", q.bytes));
  }
  if (!std::isfinite(scale) || scale < 0) {
    return Bad(absl::StrCat(op, ": scale=", scale, " must be finite and >= 0"));
  }
  return n;
}

absl::Status CheckAttendWork(absl::string_view op, int64_t queries, int64_t end, int64_t window,
                             int64_t q_heads, const RequestLimits& limits) {
  const int64_t keys = window > 0 ? std::min(end, window) : end;
  const std::optional<int64_t> pairs = CheckedMul(queries, keys);
  const std::optional<int64_t> work = pairs ? CheckedMul(*pairs, q_heads) : std::nullopt;
  if (work && *work <= limits.max_attend_work) return absl::OkStatus();
  return RefusedError(
      Refusal::kMaxAttendWork,
      absl::StrCat(op, ": ", queries, " queries x ", keys, " keys x ", q_heads,
                   " q heads = ", work ? absl::StrCat(*work) : std::string("more than 2^63"),
                   " exceeds max_attend_work=", limits.max_attend_work,
                   "; split the call into fewer queries"));
}

absl::Status CheckGrowth(absl::string_view op, absl::string_view what, int64_t len, int64_t n,
                         const RequestLimits& limits) {
  if (n < 0 || len < 0 || n > limits.max_positions - len) {
    return Bad(absl::StrCat(op, ": ", what, "=", len, " + ", n,
                            " tokens passes the largest position ", limits.max_positions,
                            " the kernels index"));
  }
  return absl::OkStatus();
}

}  // namespace kvarena
