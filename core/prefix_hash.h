// Content addresses of full pages for prefix reuse (docs/prefix-reuse.md).
//
// Every full page of a cache whose token ids are known is named by a chained 128-bit
// hash: a page's hash covers its parent's hash (the page before it, or the root for the
// first page) and its own page_size token ids; the root covers the prefix namespace, the
// representation (activation dtype, KV format, its scale layout, the digest of its static
// scales) and the geometry (page_size, num_kv_heads, head_dim, num_layers, each layer's
// attention window: a window changes the K/V of every layer after it). The hash is
// XXH3-128 (xxHash 0.8, a fixed, documented algorithm: the same bytes give the same hash
// in every process, build and version since 0.8.0) over little-endian encodings:
//
//   root      = XXH3_128("kvarena.prefix.v<kKvLayoutVersion>" ‖ u32 len(ns) ‖ ns ‖ u32 dtype
//                        ‖ u32 kv_format ‖ u32 scales ‖ u32 page_size ‖ u32 num_kv_heads
//                        ‖ u32 head_dim ‖ u32 num_layers ‖ u64 scales_digest
//                        ‖ u32 window[0] ‖ ... ‖ u32 window[num_layers - 1])
//   scales_digest = XXH3_64(f32 k_scales[0..] ‖ f32 v_scales[0..]) for a format with static
//                   scales (fp8_e4m3: the resolved [num_layers][num_kv_heads] of each), else 0
//   page hash = XXH3_128(u64 parent.low ‖ u64 parent.high ‖ i32 token[0] ‖ ... ‖ i32 token[P-1])
//
// A hash only finds candidates: a hit is confirmed by comparing token ids and the parent
// link (core/prefix_index.h), so a collision never hands out another prompt's K/V.
//
// Pure functions; thread-safe.
#ifndef KVARENA_CORE_PREFIX_HASH_H_
#define KVARENA_CORE_PREFIX_HASH_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "core/types.h"

namespace kvarena {

// The version of how K/V is laid out and named: the prefix hashes' domain and the tier
// chunks' format version (core/tier_chunk.h) both name it, so a layout change (2: the KV
// format in the root and the chunk header; 3: the static scales' digest in both, the layer
// windows in the root) misses
// every page and chunk of the one before.
inline constexpr uint32_t kKvLayoutVersion = 3;

struct Hash128 {
  uint64_t low = 0;
  uint64_t high = 0;

  friend bool operator==(const Hash128& a, const Hash128& b) {
    return a.low == b.low && a.high == b.high;
  }
  friend bool operator!=(const Hash128& a, const Hash128& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const Hash128& x) {
    return H::combine(std::move(h), x.low, x.high);
  }
  // 32 hex digits, high then low (XXH128's canonical order).
  std::string Hex() const;
};

// The root of every chain of caches with this namespace and this (resolved) geometry.
Hash128 PrefixRootHash(absl::string_view prefix_namespace, const CacheSpec& spec);
// The digest of spec's static scales (as above; 0 for a format without them). spec's scales
// as Allocate resolved them: unset ones filled with 1, so "unset" and "all 1" are one identity.
uint64_t StaticScalesDigest(const CacheSpec& spec);
// The hash of a page holding tokens[0..n) whose parent hash is `parent`.
Hash128 PrefixPageHash(const Hash128& parent, const int32_t* tokens, int n);
// Keeps the low `bits` bits of h (tests force collisions with few bits; 128: h itself).
Hash128 KeepHashBits(const Hash128& h, int bits);

}  // namespace kvarena

#endif  // KVARENA_CORE_PREFIX_HASH_H_
