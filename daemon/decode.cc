#include "daemon/decode.h"

#include <algorithm>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/validate.h"
#include "proto/wire.h"

namespace kvarena {
namespace {

// value must lie in [lo, hi] (hi <= INT_MAX), as allocate's spec field `field`.
absl::StatusOr<int> SpecField(absl::string_view field, uint64_t value, int lo, int hi) {
  if (value < uint64_t(lo) || value > uint64_t(hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocate: spec.", field, "=", value, " must be in [", lo, ", ", hi, "]"));
  }
  return int(value);
}

}  // namespace

absl::StatusOr<CacheSpec> DecodeSpec(const v1::CacheSpec& p) {
  CacheSpec s;
  KVARENA_ASSIGN_OR_RETURN(s.num_layers, SpecField("num_layers", p.num_layers(), 1, kMaxLayers));
  KVARENA_ASSIGN_OR_RETURN(s.num_kv_heads,
                           SpecField("num_kv_heads", p.num_kv_heads(), 1, kMaxKvHeads));
  KVARENA_ASSIGN_OR_RETURN(s.head_dim, SpecField("head_dim", p.head_dim(), 1, kMaxHeadDim));
  KVARENA_ASSIGN_OR_RETURN(s.page_size, SpecField("page_size", p.page_size(), 0, kMaxPageSize));
  s.dtype = FromProto(p.dtype());
  // An unknown format must not read as unset (the dtype's own): refused by its number.
  if (p.kv_format() != v1::KV_FORMAT_UNSPECIFIED &&
      FindKvFormat(KvFormat(p.kv_format())) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("allocate: spec.kv_format=", int(p.kv_format()),
                                                   " is not a KV format (KvFormat)"));
  }
  s.kv_format = KvFormat(p.kv_format());
  s.layer_windows.reserve(size_t(p.layer_windows_size()));
  for (int i = 0; i < p.layer_windows_size(); ++i) {
    const uint32_t w = p.layer_windows(i);
    if (w > uint32_t(std::numeric_limits<int>::max())) {
      return absl::InvalidArgumentError(absl::StrCat("allocate: spec.layer_windows[", i, "]=", w,
                                                     " must be 0 (global) or in [2, ",
                                                     std::numeric_limits<int>::max(), "]"));
    }
    s.layer_windows.push_back(int(w));
  }
  KVARENA_ASSIGN_OR_RETURN(s.max_tokens,
                           DecodeInt64("allocate", "spec.max_tokens", p.max_tokens()));
  s.prefix_namespace = p.prefix_namespace();                    // core bounds its length
  s.k_scales.assign(p.k_scales().begin(), p.k_scales().end());  // core checks count and values
  s.v_scales.assign(p.v_scales().begin(), p.v_scales().end());
  return s;
}

absl::StatusOr<int> DecodeLayer(absl::string_view op, uint32_t layer) {
  if (layer >= uint32_t(kMaxLayers)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": layer=", layer, " but a cache has at most ", kMaxLayers, " layers"));
  }
  return int(layer);
}

absl::StatusOr<int64_t> DecodeInt64(absl::string_view op, absl::string_view field, uint64_t value) {
  if (value > uint64_t(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", field, "=", value, " must be below 2^63"));
  }
  return int64_t(value);
}

absl::StatusOr<std::vector<CacheTokens>> DecodeItems(
    absl::string_view op, const google::protobuf::RepeatedPtrField<v1::CacheTokens>& items) {
  if (items.size() > kMaxItems) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", items.size(), " items; at most ", kMaxItems));
  }
  std::vector<CacheTokens> out;
  out.reserve(size_t(items.size()));
  for (int i = 0; i < items.size(); ++i) {
    absl::StatusOr<int64_t> tokens =
        DecodeInt64(op, absl::StrCat("items[", i, "].tokens"), items[i].tokens());
    KVARENA_RETURN_IF_ERROR(tokens.status());
    out.push_back(CacheTokens{items[i].cache_id(), *tokens});
  }
  return out;
}

size_t DecodePageSize(uint32_t page_size) {
  if (page_size == 0) return kDefaultListPage;
  return std::min(page_size, kMaxListPage);
}

namespace {
constexpr absl::string_view kPageTokenPrefix = "after:";  // inside the base64
}  // namespace

std::string EncodePageToken(const std::string& last_cache_id) {
  return absl::WebSafeBase64Escape(absl::StrCat(kPageTokenPrefix, last_cache_id));
}

absl::StatusOr<std::string> DecodePageToken(const std::string& token) {
  if (token.empty()) return std::string();
  std::string raw;
  const bool ok = token.size() <= 4 * (kPageTokenPrefix.size() + kMaxCacheIdBytes) &&
                  absl::WebSafeBase64Unescape(token, &raw) &&
                  absl::StartsWith(raw, kPageTokenPrefix) && raw.size() > kPageTokenPrefix.size() &&
                  raw.size() - kPageTokenPrefix.size() <= kMaxCacheIdBytes;
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "list_caches: page_token of ", token.size(),
        " bytes is not a next_page_token a ListCaches reply gave; send \"\" for the first page"));
  }
  return raw.substr(kPageTokenPrefix.size());
}

}  // namespace kvarena
