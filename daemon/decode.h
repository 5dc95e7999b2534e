// Checked decoding of request fields: every wire integer is range-checked before it is
// narrowed to the type core takes, so a refusal names the number the caller sent
// ("append: layer=4294967295 ...", never a wrapped -1). Fields that need no narrowing
// (uint64 counts core takes as uint64, int64 shapes, strings) pass through, and core
// checks their meaning. Each failure is INVALID_ARGUMENT naming the operation and field.
//
// Pure functions; thread-safe.
#ifndef KVARENA_DAEMON_DECODE_H_
#define KVARENA_DAEMON_DECODE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/types.h"
#include "kvarena/v1/kvarena.pb.h"

namespace kvarena {

// Most items one Reserve / Commit may list.
inline constexpr int kMaxItems = 65536;

// A spec whose integer fields fit the ranges core documents (core/validate.h), windows
// included; core resolves and checks the rest.
absl::StatusOr<CacheSpec> DecodeSpec(const v1::CacheSpec& p);
// A layer index that fits a cache (< kMaxLayers); core checks it against the cache.
absl::StatusOr<int> DecodeLayer(absl::string_view op, uint32_t layer);
// A count or position that fits int64.
absl::StatusOr<int64_t> DecodeInt64(absl::string_view op, absl::string_view field, uint64_t value);
// Reserve / Commit items, at most kMaxItems, with tokens that fit int64.
absl::StatusOr<std::vector<CacheTokens>> DecodeItems(
    absl::string_view op, const google::protobuf::RepeatedPtrField<v1::CacheTokens>& items);

// ListCaches paging. A page_size of 0 means kDefaultListPage; above kMaxListPage it is
// kMaxListPage. A page token is opaque to clients (the last cache id of a page, encoded);
// DecodePageToken gives the id to list after ("" for the first page), INVALID_ARGUMENT
// for a token no page gave.
inline constexpr uint32_t kDefaultListPage = 1000;
inline constexpr uint32_t kMaxListPage = 10000;
size_t DecodePageSize(uint32_t page_size);
std::string EncodePageToken(const std::string& last_cache_id);
absl::StatusOr<std::string> DecodePageToken(const std::string& token);

}  // namespace kvarena

#endif  // KVARENA_DAEMON_DECODE_H_
