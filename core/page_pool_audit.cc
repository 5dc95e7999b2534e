// PagePool's audit, for tests and the fuzzers: every page's references, taken bit and
// cached state checked against what the caches hold, the counts against the pages, and
// the index against the caches' holds and its tier flags against the pool's tiers
// (TEST_Audit, which KvStore's TEST_CheckInvariants runs on every pool), plus the pool's
// other TEST_ probes (page_pool.h).
#include "absl/strings/str_cat.h"
#include "core/page_pool.h"

namespace kvarena {

bool PagePool::TEST_IsAllocated(int32_t id) const {
  absl::MutexLock lock(&mu_);
  if (id < 0 || size_t(id / pages_per_chunk_) >= chunks_.size()) return false;
  const Chunk& chunk = chunks_[size_t(id / pages_per_chunk_)];
  if (!chunk.committed) return false;
  return chunk.refs[size_t(id % pages_per_chunk_)] > 0;
}

int32_t PagePool::TEST_Refs(int32_t id) const {
  return TEST_IsAllocated(id) ? [&] {
    absl::MutexLock lock(&mu_);
    return RefsLocked(id);
  }() : 0;
}

size_t PagePool::TEST_MetadataBytes() const {
  if (Metadata() == nullptr) return 0;
  absl::MutexLock lock(&mu_);
  return index_.TEST_NodeBytes() + size_t(chunks_committed_) * ChunkMetadataBytes();
}

absl::Status PagePool::TEST_Audit(const absl::flat_hash_map<int32_t, int32_t>& refs,
                                  const absl::flat_hash_map<uint64_t, int64_t>& holds) const {
  absl::MutexLock lock(&mu_);
  int64_t taken = 0, shared = 0, parked = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const Chunk& chunk = chunks_[c];
    if (!chunk.committed) continue;
    int32_t chunk_cached = 0;
    for (int32_t i = 0; i < pages_per_chunk_; ++i) {
      const int32_t id = int32_t(c) * pages_per_chunk_ + i;
      auto want = refs.find(id);
      const int32_t expect = want == refs.end() ? 0 : want->second;
      const int32_t have = chunk.refs[size_t(i)];
      if (have != expect) {
        return absl::InternalError(absl::StrCat("page ", id, " of pool ", id_, " counts ", have,
                                                " references but caches hold it ", expect,
                                                " times"));
      }
      const bool cached = cache_->Lookup(id);
      if (chunk.taken[size_t(i)] != (have > 0 || cached)) {
        return absl::InternalError(absl::StrCat("page ", id, " of pool ", id_, " is ",
                                                chunk.taken[size_t(i)] ? "taken" : "free", " with ",
                                                have, " references", cached ? ", cached" : ""));
      }
      if (have == 0 && index_.IsRegistered(id) != cached) {
        return absl::InternalError(absl::StrCat("page ", id, " of pool ", id_,
                                                " is registered but unreferenced and not cached"));
      }
      if (have > 0 && cached) {
        return absl::InternalError(
            absl::StrCat("page ", id, " of pool ", id_, " is referenced and cached"));
      }
      taken += chunk.taken[size_t(i)];
      chunk_cached += cached;
      shared += have >= 2;
      parked += cached;
    }
    if (chunk_cached != chunk.cached) {
      return absl::InternalError(absl::StrCat("chunk ", c, " of pool ", id_, " counts ",
                                              chunk.cached, " cached pages but holds ",
                                              chunk_cached));
    }
  }
  for (const auto& [id, n] : refs) {
    if (id < 0 || size_t(id / pages_per_chunk_) >= chunks_.size() ||
        !chunks_[size_t(id / pages_per_chunk_)].committed) {
      return absl::InternalError(
          absl::StrCat("page ", id, " of pool ", id_, " is held by a cache but not committed"));
    }
  }
  if (taken != pages_used_ || shared != pages_shared_ || parked != cache_->size()) {
    return absl::InternalError(absl::StrCat(
        "pool ", id_, " counts ", pages_used_, " taken, ", pages_shared_, " shared, ",
        cache_->size(), " cached pages but holds ", taken, ", ", shared, ", ", parked));
  }
  // Pages a cache loaded from a tier (InstallLoaded) need nothing of their own here: each
  // came from Allocate with one reference, was registered like a computed page, and is
  // held in the loading cache's tables, so the reference, taken and registered checks
  // above count them like any other. What the tiers add is the index's tier flags: set
  // only where this pool's tiers take that kind of chunk (a pool without tiers has none).
  uint8_t tier_flags = 0;
  if (TiersFor(PrefixIndex::kTierFull) != nullptr) tier_flags |= PrefixIndex::kTierFull;
  if (TiersFor(PrefixIndex::kTierEvicted) != nullptr) tier_flags |= PrefixIndex::kTierEvicted;
  return index_.TEST_Audit(holds, tier_flags);
}

}  // namespace kvarena
