// The host tier: chunks in the daemon's own memory, an LRU by bytes (docs/tiers.md).
// Values are held whole; Put drops the least recently used values to make room and hands
// them to the caller (TierSet demotes them to the disk tier), Get refreshes recency.
// Nothing survives the process.
//
// Thread-safe.
#ifndef KVARENA_TIERS_HOST_STORE_H_
#define KVARENA_TIERS_HOST_STORE_H_

#include <cstdint>
#include <memory>

#include "core/tier_store.h"

namespace kvarena {

// A host store holding at most bytes_limit bytes of values (the values' sizes; the
// index's own few dozen bytes a chunk are not counted). Medium "host". A value bigger
// than bytes_limit is RESOURCE_EXHAUSTED (so with 0 nothing is stored).
std::unique_ptr<TierStore> NewHostStore(uint64_t bytes_limit);

}  // namespace kvarena

#endif  // KVARENA_TIERS_HOST_STORE_H_
