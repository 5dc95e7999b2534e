#include "core/prefix_hash.h"

#include <xxhash.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/little_endian.h"

namespace kvarena {
namespace {

Hash128 Xxh128(const std::string& bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return Hash128{h.low64, h.high64};
}

}  // namespace

std::string Hash128::Hex() const { return absl::StrFormat("%016x%016x", high, low); }

uint64_t StaticScalesDigest(const CacheSpec& spec) {
  if (ScalesOf(ResolveKvFormat(spec.kv_format, spec.dtype)) != KvScales::kPerHead) return 0;
  std::string b;
  b.reserve(4 * (spec.k_scales.size() + spec.v_scales.size()));
  for (const std::vector<float>* scales : {&spec.k_scales, &spec.v_scales}) {
    for (float x : *scales) {
      uint32_t bits;
      std::memcpy(&bits, &x, sizeof(bits));
      PutU32(&b, bits);
    }
  }
  return XXH3_64bits(b.data(), b.size());
}

Hash128 PrefixRootHash(absl::string_view prefix_namespace, const CacheSpec& spec) {
  std::string b = absl::StrCat("kvarena.prefix.v", kKvLayoutVersion);
  PutU32(&b, uint32_t(prefix_namespace.size()));
  b.append(prefix_namespace.data(), prefix_namespace.size());
  const KvFormat format = ResolveKvFormat(spec.kv_format, spec.dtype);
  for (int v : {int(spec.dtype), int(format), int(ScalesOf(format)), spec.page_size,
                spec.num_kv_heads, spec.head_dim, spec.num_layers}) {
    PutU32(&b, uint32_t(v));
  }
  PutU64(&b, StaticScalesDigest(spec));
  for (int l = 0; l < spec.num_layers; ++l) {  // unset windows are global (0)
    PutU32(&b, uint32_t(size_t(l) < spec.layer_windows.size() ? spec.layer_windows[size_t(l)] : 0));
  }
  return Xxh128(b);
}

Hash128 PrefixPageHash(const Hash128& parent, const int32_t* tokens, int n) {
  std::string b;
  b.reserve(16 + 4 * size_t(n));
  PutU64(&b, parent.low);
  PutU64(&b, parent.high);
  for (int i = 0; i < n; ++i) PutU32(&b, uint32_t(tokens[i]));
  return Xxh128(b);
}

Hash128 KeepHashBits(const Hash128& h, int bits) {
  if (bits >= 128) return h;
  if (bits <= 0) return Hash128{};
  if (bits >= 64)
    return Hash128{h.low, bits == 64 ? 0 : h.high & ((uint64_t{1} << (bits - 64)) - 1)};
  return Hash128{h.low & ((uint64_t{1} << bits) - 1), 0};
}

}  // namespace kvarena
