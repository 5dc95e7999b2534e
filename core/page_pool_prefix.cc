// PagePool's prefix-reuse operations: chains of index nodes, lookup and adoption, page
// registration, and the cached pages (registered, unreferenced): parking them, their
// eviction and reclaim (page_pool.h; the audit is page_pool_audit.cc).
#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/page_pool.h"
#include "core/tier_set.h"

namespace kvarena {

namespace {
// Index nodes a chain gains or drops per hold of the pool's lock, so a long prompt keeps
// other callers of the pool waiting for a bounded time at once.
constexpr size_t kChainBatch = 4096;
}  // namespace

void PagePool::ExtendChain(const PrefixQuery& q, PrefixChain* chain) {
  chain->nodes.reserve(size_t(q.num_blocks));
  PrefixQuery part = q;
  while (!chain->blocked && int64_t(chain->nodes.size()) < q.num_blocks) {
    part.num_blocks = std::min<int64_t>(q.num_blocks, int64_t(chain->nodes.size() + kChainBatch));
    absl::MutexLock lock(&mu_);
    ExtendChainLocked(part, chain);
  }
}

void PagePool::ExtendChainLocked(const PrefixQuery& q, PrefixChain* chain) {
  if (chain->blocked || q.num_blocks <= int64_t(chain->nodes.size())) return;
  if (chain->root == PrefixIndex::kNoNode) {
    chain->root =
        index_.HoldRoot(q.root_key, q.prefix_namespace, q.scales_digest, q.root_hash, q.num_layers);
    if (chain->root == PrefixIndex::kNoNode) {
      chain->blocked = true;  // the metadata budget is spent: nothing of it is indexed
      return;
    }
  }
  chain->nodes.reserve(size_t(q.num_blocks));  // no allocation between a hold and its record
  for (int64_t b = int64_t(chain->nodes.size()); b < q.num_blocks; ++b) {
    const uint64_t parent = b == 0 ? chain->root : chain->nodes[size_t(b - 1)];
    const uint64_t node =
        index_.HoldChild(parent, q.hashes[b], q.tokens + b * q.page_size, q.page_size);
    if (node == PrefixIndex::kNoNode) {
      chain->blocked = true;
      return;
    }
    chain->nodes.push_back(node);
  }
}

void PagePool::AdoptPrefix(const PrefixQuery& q, PrefixChain* chain, PrefixHit* hit) {
  *hit = PrefixHit{};
  absl::MutexLock lock(&mu_);
  ExtendChainLocked(q, chain);
  const int64_t most = std::min<int64_t>(int64_t(chain->nodes.size()), q.max_adopt);
  auto has = [&](int64_t b, int layer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return index_.PageOf(chain->nodes[size_t(b)], layer) >= 0;
  };
  auto first_needed = [&](int layer, int64_t k) {
    return FirstBlockNeeded(q.layer_windows[size_t(layer)], k, q.page_size);
  };
  // Global layers need every leading block: the shortest run bounds the hit.
  int64_t k = most;
  for (int l = 0; l < q.num_layers && k > 0; ++l) {
    if (q.layer_windows[size_t(l)] != 0) continue;
    int64_t run = 0;
    while (run < k && has(run, l)) ++run;
    k = run;
  }
  // Sliding layers need only the blocks their window still sees: try shorter hits.
  for (; k > 0; --k) {
    bool all = true;
    for (int l = 0; l < q.num_layers && all; ++l) {
      if (q.layer_windows[size_t(l)] == 0) continue;
      for (int64_t b = first_needed(l, k); b < k && all; ++b) all = has(b, l);
    }
    if (all) break;
  }
  if (k == 0) return;
  int64_t count = 0;
  for (int l = 0; l < q.num_layers; ++l) count += k - first_needed(l, k);
  if (q.charge && !q.charge(count)) return;
  hit->blocks = k;
  hit->pages_adopted = count;
  hit->first_block.resize(size_t(q.num_layers));
  hit->pages.resize(size_t(q.num_layers));
  for (int l = 0; l < q.num_layers; ++l) {
    const int64_t first = first_needed(l, k);
    hit->first_block[size_t(l)] = first;
    std::vector<int32_t>& ids = hit->pages[size_t(l)];
    for (int64_t b = first; b < k; ++b) {
      const int32_t id = index_.PageOf(chain->nodes[size_t(b)], l);
      int32_t& refs = RefsLocked(id);
      if (refs == 0) UnparkLocked(id);
      if (++refs == 2) ++pages_shared_;
      ids.push_back(id);
    }
  }
}

int64_t PagePool::Register(absl::Span<const PageToRegister> pages) {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const PageToRegister& p : pages) n += RegisterLocked(p.node, p.layer, p.page) ? 1 : 0;
  return n;
}

void PagePool::TruncateChain(PrefixChain* chain, size_t from) {
  if (from <= chain->nodes.size()) chain->blocked = false;
  // Deepest first (a node goes only without children), a batch per hold of the lock.
  while (chain->nodes.size() > from + kChainBatch) {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < kChainBatch; ++i) {
      index_.Unhold(chain->nodes.back());
      chain->nodes.pop_back();
    }
  }
  absl::MutexLock lock(&mu_);
  while (chain->nodes.size() > from) {
    index_.Unhold(chain->nodes.back());
    chain->nodes.pop_back();
  }
  if (from == 0 && chain->root != PrefixIndex::kNoNode) {
    index_.Unhold(chain->root);
    chain->root = PrefixIndex::kNoNode;
  }
}

void PagePool::HoldChain(const PrefixChain& chain) {
  absl::MutexLock lock(&mu_);
  if (chain.root != PrefixIndex::kNoNode) index_.Hold(chain.root);
  for (uint64_t node : chain.nodes) index_.Hold(node);
}

void PagePool::ParkLocked(int32_t id) {
  cache_->Insert(id);
  ++ChunkOf(id).cached;
}

void PagePool::UnparkLocked(int32_t id) {
  cache_->Erase(id);
  --ChunkOf(id).cached;
}

void PagePool::EvictedLocked(int32_t page) {
  const uint64_t node = index_.NodeOfPage(page);
  PrefixEvent e;
  e.kind = PrefixEvent::Kind::kRemoved;
  e.pool_id = id_;
  std::tie(e.hash, e.layer) = index_.KeyOfPage(page);
  // The first page of a chunk to leave sends the chunk down, while the rest is still here.
  const uint64_t end =
      TiersFor(PrefixIndex::kTierEvicted) != nullptr ? ChunkEndLocked(node) : PrefixIndex::kNoNode;
  if (end != PrefixIndex::kNoNode && (index_.TierFlagsOf(end) & PrefixIndex::kTierEvicted) == 0) {
    std::vector<PrefixEvent> after;
    after.push_back(std::move(e));
    CaptureChunkLocked(end, PrefixIndex::kTierEvicted, std::move(after));
  } else if (const Hash128* key = index_.TierKeyOf(node);
             key != nullptr && counters_->tiers != nullptr) {
    counters_->tiers->RecordAfterWrite(*key, std::move(e));
  } else {
    RecordLocked(std::move(e));
  }
  index_.Unregister(page);
  --ChunkOf(page).cached;
}

int32_t PagePool::ReclaimLocked() {
  const int32_t id = cache_->Evict();  // stays taken: it goes straight to the caller
  RefsLocked(id) = 1;
  return id;
}

size_t PagePool::FreeableMetadataBytes() const {
  absl::MutexLock lock(&mu_);
  return index_.FreeableBytes([this](int32_t page)
                                  ABSL_NO_THREAD_SAFETY_ANALYSIS { return RefsLocked(page) > 0; });
}

uint64_t PagePool::OldestCachedStamp() const {
  absl::MutexLock lock(&mu_);
  return cache_->OldestStamp();
}

int64_t PagePool::EvictCachedBefore(uint64_t before, const std::function<bool()>& done,
                                    int64_t max_pages) {
  absl::MutexLock lock(&mu_);
  int64_t evicted = 0;
  while (evicted < max_pages && cache_->size() > 0 && cache_->OldestStamp() < before && !done()) {
    const int32_t id = cache_->Evict();
    FreeLocked({&id, 1});
    ++evicted;
  }
  if (counters_ != nullptr) counters_->pages_reclaimed_for_metadata += uint64_t(evicted);
  return evicted;
}

size_t PagePool::ReclaimableBytes() const {
  absl::MutexLock lock(&mu_);
  int64_t chunks = 0;
  for (const Chunk& c : chunks_) chunks += c.committed && c.used == c.cached;
  return size_t(chunks) * chunk_bytes_;
}

size_t PagePool::TrimCached(size_t bytes) {
  absl::MutexLock lock(&mu_);
  const int64_t before = chunks_committed_;
  auto freed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return size_t(before - chunks_committed_) * chunk_bytes_;
  };
  for (int32_t c = 0; c < int32_t(chunks_.size()) && freed() < bytes; ++c) {
    if (chunks_[c].committed && chunks_[c].used == 0) DecommitChunkLocked(c);
  }
  if (freed() >= bytes || cache_->size() == 0) return freed();
  for (int32_t id : cache_->EvictionOrder()) {
    if (freed() >= bytes) break;
    const Chunk& chunk = ChunkOf(id);
    if (chunk.used != chunk.cached) continue;  // live pages keep this chunk committed
    cache_->Evict(id);
    FreeLocked({&id, 1}, /*force_decommit=*/true);
    if (counters_ != nullptr) ++counters_->pages_reclaimed;
  }
  return freed();
}

}  // namespace kvarena
