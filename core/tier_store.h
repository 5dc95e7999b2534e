// TierStore: one medium below the arena — host memory, a local disk, a Redis Cluster —
// keeping encoded chunks (core/tier_chunk.h) by key (docs/tiers.md). The stores live in
// tiers/; core sees only this interface, through TierSet (core/tier_set.h), which orders
// them, verifies what they return and feeds them from its write queue.
//
// A store is a map from ChunkKey to bytes with a byte limit: Put makes room by dropping
// its least recently used values (handing them to the caller, who may demote them to the
// next tier), Get refreshes a value's recency. A store never interprets a value: a
// corrupt one is found by the caller's verification, which then Erases it.
//
// Thread-safety: implementations are safe for concurrent use (lookups from many Allocate
// callers, writes from TierSet's writer thread). No method is called with an arena, pool
// or cache lock held.
#ifndef KVARENA_CORE_TIER_STORE_H_
#define KVARENA_CORE_TIER_STORE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/prefix_hash.h"

namespace kvarena {

// A chunk's key: ChunkKeyOf(tenant, chunk pages, chained hash of the chunk's last page).
using ChunkKey = Hash128;

// What a store holds now.
struct TierUsage {
  uint64_t bytes_used = 0;
  uint64_t bytes_limit = 0;  // 0: no limit of its own (the cluster's maxmemory)
  int64_t chunks = 0;
  bool up = true;  // false while the medium cannot be reached (a Redis Cluster down)
};

// A value Put dropped to make room, for the next tier down.
struct EvictedChunk {
  ChunkKey key;
  std::string value;
};

class TierStore {
 public:
  virtual ~TierStore() = default;

  // "host", "disk" or "redis": TierStats.medium and the KvEvent medium of what it holds.
  virtual std::string medium() const = 0;
  // The value under key. NOT_FOUND: a miss; DATA_LOSS: the key holds something that is no
  // chunk (the caller counts it corrupt and erases it, as a value that fails
  // verification); any other error (UNAVAILABLE, DEADLINE_EXCEEDED, an I/O error) is
  // counted by the caller as a tier error and treated as a miss. Returns
  // by `deadline` where the medium allows (a network store does; a local read of one
  // chunk is not interrupted).
  virtual absl::StatusOr<std::string> Get(const ChunkKey& key, absl::Time deadline) = 0;
  // Whether the store holds key now, without reading the value; false on an error.
  virtual bool Contains(const ChunkKey& key) = 0;
  // Stores value under key (replacing any value it had), first dropping least recently
  // used values until it fits; what it dropped is appended to *evicted (may be null: the
  // values are discarded) when the store can hand it on. RESOURCE_EXHAUSTED when the
  // value cannot fit at all (bigger than the limit, a full disk); other codes for errors.
  // Nothing is stored on an error.
  virtual absl::Status Put(const ChunkKey& key, absl::string_view value,
                           std::vector<EvictedChunk>* evicted) = 0;
  // Drops key if present (a value that failed verification).
  virtual void Erase(const ChunkKey& key) = 0;
  virtual TierUsage Usage() const = 0;
};

}  // namespace kvarena

#endif  // KVARENA_CORE_TIER_STORE_H_
