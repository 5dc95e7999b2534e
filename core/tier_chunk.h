// The chunk: the unit the tiers below the arena keep (docs/tiers.md). A chunk is
// `chunk_pages` (P) consecutive full pages of one prefix chain, aligned from position 0
// (chunk c holds blocks [c*P, c*P + P)), for every layer, K and V. It is self-describing,
// so a store can hold it as opaque bytes and a reader can prove it is the K/V it wants:
//
//   magic "KVACHNK1"  u32 format version (kKvLayoutVersion)
//   u32 dtype  u32 kv_format  u32 scales (KvScales)
//   u32 page_size  u32 num_kv_heads  u32 head_dim  u32 num_layers  u32 P
//   u64 scales_digest                     (StaticScalesDigest: 0 without static scales)
//   u64 first_block                       (c * P)
//   u32 len(tenant)  tenant  u32 len(namespace)  namespace
//   parent hash (u64 low, u64 high)       (chained hash of block first_block - 1; the
//                                          namespace root's for chunk 0)
//   last hash (u64 low, u64 high)         (chained hash of block first_block + P - 1)
//   i32 token id x (P * page_size)
//   u32 first_page x num_layers           (layer l holds blocks [first_page[l], P) of the
//                                          chunk: a sliding layer whose window dropped its
//                                          early pages keeps only the tail; P: none)
//   payload: for each layer in order, its pages first_page[l] .. P-1, each PageBytes()
//            bytes laid out as the pool's pages (kvarena/paged_kv.h: [2][page_size]
//            token rows, a quantized format's scales in them), never converted
//   u64 XXH3-64 of every byte before it
//
// All integers little-endian. The key a store files it under is ChunkKeyOf(tenant, P,
// last hash): content-addressed, tenant-scoped.
//
// Pure functions; thread-safe.
#ifndef KVARENA_CORE_TIER_CHUNK_H_
#define KVARENA_CORE_TIER_CHUNK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/prefix_hash.h"
#include "core/tier_store.h"
#include "kernels/paged_kv.h"

namespace kvarena {

// The chunk's version is the layout version the prefix hashes name (core/prefix_hash.h),
// so the two cannot drift apart.
inline constexpr uint32_t kChunkFormatVersion = kKvLayoutVersion;

// Everything a chunk's header says, and everything a reader demands of it.
struct ChunkIdentity {
  std::string tenant;  // the pool's owner (--tenants_file); "" without tenants
  std::string prefix_namespace;
  PageLayout layout;
  uint64_t scales_digest = 0;  // StaticScalesDigest of the writer's cache (core/prefix_hash.h)
  int32_t num_layers = 0;
  int32_t chunk_pages = 0;  // P
  int64_t first_block = 0;  // a multiple of P
  Hash128 parent_hash;
  Hash128 last_hash;
  std::vector<int32_t> tokens;  // P * page_size

  ChunkKey key() const;
};

// XXH3-128 of ("kvarena.chunk.v<kChunkFormatVersion>" ‖ u32 P ‖ u32 len(tenant) ‖ tenant ‖
// last_hash). P is in it because it decides what a chunk holds: nodes of another
// --tier_chunk_pages miss each other's chunks instead of reading them as corrupt.
ChunkKey ChunkKeyOf(absl::string_view tenant, int32_t chunk_pages, const Hash128& last_hash);

// The fewest pages per chunk that make a chunk of at least min_bytes (K and V of every
// layer): at least 1.
int32_t DefaultChunkPages(size_t page_bytes, int num_layers, size_t min_bytes = 256 << 10);

// A chunk's payload bytes: sum over layers of (P - first_page[l]) pages.
size_t ChunkPayloadBytes(const ChunkIdentity& id, const std::vector<int32_t>& first_page);

// The encoded chunk. REQUIRES: first_page has num_layers entries in [0, P]; payload has
// ChunkPayloadBytes bytes; tokens has P * page_size ids.
std::string EncodeChunk(const ChunkIdentity& id, const std::vector<int32_t>& first_page,
                        absl::string_view payload);

// A chunk that passed DecodeChunk: per layer its first page, and its payload (a view into
// the value given).
struct DecodedChunk {
  std::vector<int32_t> first_page;
  absl::string_view payload;
  // The bytes of page `block` (0 .. P-1 within the chunk) of `layer`.
  // REQUIRES: first_page[layer] <= block < P.
  const uint8_t* Page(const ChunkIdentity& id, int layer, int block) const;
};

// Checks value against `want` before anything of it is used: its size, magic, version,
// geometry, P, first_block, tenant, namespace, parent and last hash, token ids, every
// first_page in range, the payload's size and the checksum. DATA_LOSS naming the first
// field that differs (with both values where they are numbers); on success *out views
// into value.
absl::Status DecodeChunk(absl::string_view value, const ChunkIdentity& want, DecodedChunk* out);

// Reads a chunk's header without demanding anything of it (the tiers' events for a value a
// store evicted): DATA_LOSS when the value is too short or its magic or version is wrong.
// Nothing of the payload is checked: never use it to adopt K/V.
absl::Status PeekChunk(absl::string_view value, ChunkIdentity* id,
                       std::vector<int32_t>* first_page);

}  // namespace kvarena

#endif  // KVARENA_CORE_TIER_CHUNK_H_
