// PagePool's side of the tiers (core/tier_set.h, docs/tiers.md): registering pages (and
// handing a full chunk to the write-through tiers), capturing a chunk whose pages are
// evicted (write-back), taking back the write-through chunks no store took (to offer them
// again), and installing pages a cache loaded from a tier.
#include <utility>

#include "core/page_pool.h"
#include "core/tier_set.h"
#include "kernels/kv_kernels.h"

namespace kvarena {

void PagePool::RecordLocked(PrefixEvent e) {
  if (counters_ != nullptr && counters_->events != nullptr) counters_->events->Append(std::move(e));
}

bool PagePool::RegisterLocked(uint64_t node, int layer, int32_t page) {
  if (!index_.Register(node, layer, page)) return false;
  if (counters_ != nullptr && counters_->events != nullptr) {
    PrefixEvent e;
    e.kind = PrefixEvent::Kind::kStored;
    e.pool_id = id_;
    e.layer = layer;
    e.hash = index_.HashOf(node);
    e.parent_hash = index_.ParentHashOf(node);
    e.token_ids = index_.TokensOf(node);
    e.prefix_namespace = index_.NamespaceOf(node);
    counters_->events->Append(std::move(e));
  }
  TierSet* tiers = TiersFor(PrefixIndex::kTierFull);
  if (tiers == nullptr) return true;
  if (tiers->HasReturns()) TakeTierReturnsLocked(tiers);
  if (!EndsChunkLocked(node) || (index_.TierFlagsOf(node) & PrefixIndex::kTierFull) != 0) {
    return true;
  }
  for (int l = 0; l < index_.NumLayersOf(node); ++l) {
    if (index_.PageOf(node, l) < 0) return true;  // the chunk is full once every layer is
  }
  CaptureChunkLocked(node, PrefixIndex::kTierFull, {});
  return true;
}

TierSet* PagePool::TiersFor(uint8_t flag) const {
  if (counters_ == nullptr || counters_->tiers == nullptr || counters_->kernels == nullptr)
    return nullptr;
  TierSet* tiers = counters_->tiers;
  const bool takes = flag == PrefixIndex::kTierFull ? tiers->takes_full() : tiers->takes_evicted();
  return takes ? tiers : nullptr;
}

bool PagePool::EndsChunkLocked(uint64_t node) const {
  const int64_t block = index_.BlockOf(node);
  if (block < 0) return false;
  const int32_t pages = counters_->tiers->ChunkPagesFor(layout_, index_.NumLayersOf(node));
  return (block + 1) % pages == 0;
}

uint64_t PagePool::ChunkEndLocked(uint64_t node) const {
  const int64_t block = index_.BlockOf(node);
  if (block < 0) return PrefixIndex::kNoNode;
  const int32_t pages = counters_->tiers->ChunkPagesFor(layout_, index_.NumLayersOf(node));
  const int64_t last = block / pages * pages + pages - 1;
  for (int64_t b = block; b < last && node != PrefixIndex::kNoNode; ++b)
    node = index_.LastChildOf(node);
  if (node == PrefixIndex::kNoNode) return node;
  for (int l = 0; l < index_.NumLayersOf(node); ++l) {
    if (index_.PageOf(node, l) < 0) return PrefixIndex::kNoNode;  // not full yet
  }
  return node;
}

void PagePool::TakeTierReturnsLocked(TierSet* tiers) {
  const TierReturns r = tiers->TakeReturns(id_);
  for (const TierReturn& f : r.failed) {
    // No store took it: the chunk's nodes that still name its key are eligible again.
    if (!index_.Contains(f.last_node)) continue;
    const int32_t pages = tiers->ChunkPagesFor(layout_, index_.NumLayersOf(f.last_node));
    uint64_t n = f.last_node;
    for (int32_t i = 0; i < pages && n != PrefixIndex::kNoNode && index_.BlockOf(n) >= 0; ++i) {
      const Hash128* key = index_.TierKeyOf(n);
      if (key != nullptr && *key == f.key) index_.ClearTiered(n, PrefixIndex::kTierFull);
      n = index_.ParentOf(n);
    }
  }
  for (const TierReturn& d : r.due) {
    // Offered again while the arena still holds it whole and nothing sent it meanwhile.
    if (!index_.Contains(d.last_node) ||
        (index_.TierFlagsOf(d.last_node) & PrefixIndex::kTierFull) != 0 ||
        ChunkEndLocked(d.last_node) != d.last_node) {
      continue;
    }
    CaptureChunkLocked(d.last_node, PrefixIndex::kTierFull, {}, d.attempts);
  }
}

void PagePool::CaptureChunkLocked(uint64_t last, uint8_t flag, std::vector<PrefixEvent> after,
                                  int attempts) {
  TierSet* tiers = counters_->tiers;
  const int num_layers = index_.NumLayersOf(last);
  const int32_t chunk_pages = tiers->ChunkPagesFor(layout_, num_layers);
  std::vector<uint64_t> nodes(static_cast<size_t>(chunk_pages));
  uint64_t n = last;
  for (int32_t i = chunk_pages - 1; i >= 0; --i) {
    nodes[size_t(i)] = n;
    n = index_.ParentOf(n);
  }
  ChunkWrite w;
  w.first_page.assign(size_t(num_layers), chunk_pages);
  std::vector<int32_t> ids;
  for (int l = 0; l < num_layers; ++l) {
    int32_t first = chunk_pages;
    while (first > 0 && index_.PageOf(nodes[size_t(first - 1)], l) >= 0) --first;
    w.first_page[size_t(l)] = first;
    for (int32_t b = first; b < chunk_pages; ++b) ids.push_back(index_.PageOf(nodes[size_t(b)], l));
  }
  ChunkIdentity& id = w.id;
  id.tenant = owner_;
  id.prefix_namespace = index_.NamespaceOf(last);
  id.layout = layout_;
  id.scales_digest = index_.ScalesDigestOf(last);
  id.num_layers = num_layers;
  id.chunk_pages = chunk_pages;
  id.first_block = index_.BlockOf(nodes[0]);
  id.parent_hash = index_.ParentHashOf(nodes[0]);
  id.last_hash = index_.HashOf(last);
  id.tokens.reserve(size_t(chunk_pages) * size_t(layout_.page_size));
  for (uint64_t node : nodes) {
    const std::vector<int32_t>& t = index_.TokensOf(node);
    id.tokens.insert(id.tokens.end(), t.begin(), t.end());
  }
  // An evicted chunk no write-through store took yet goes to them too: its last chance.
  uint8_t flags = flag;
  if (flag == PrefixIndex::kTierEvicted && tiers->takes_full() &&
      (index_.TierFlagsOf(last) & PrefixIndex::kTierFull) == 0) {
    flags |= PrefixIndex::kTierFull;
  }
  w.pool_id = id_;
  w.write_through = (flags & PrefixIndex::kTierFull) != 0;
  w.write_back = (flags & PrefixIndex::kTierEvicted) != 0;
  w.last_node = last;
  w.attempts = attempts;
  // The queue's room first: a chunk it cannot admit is not copied (and stays eligible).
  const size_t payload = ids.size() * page_bytes_;
  if (ids.empty() || !tiers->Reserve(w, payload)) {
    for (PrefixEvent& e : after) RecordLocked(std::move(e));
    return;
  }
  w.payload.resize(payload);
  if (!counters_->kernels
           ->ReadPages(layout_, base(), ids.data(), int64_t(ids.size()),
                       reinterpret_cast<uint8_t*>(w.payload.data()))
           .ok()) {
    tiers->Unreserve(TierSet::QueuedFootprint(w));
    for (PrefixEvent& e : after) RecordLocked(std::move(e));
    return;
  }
  // Marked as handed down; a write no store took comes back (TakeTierReturnsLocked).
  const ChunkKey key = id.key();
  for (uint64_t node : nodes) index_.MarkTiered(node, key, flags);
  w.after = std::move(after);
  tiers->Queue(std::move(w));
}

void PagePool::InstallLoaded(absl::Span<PageToRegister> pages) {
  std::vector<int32_t> unused;
  {
    absl::MutexLock lock(&mu_);
    for (PageToRegister& p : pages) {
      if (RegisterLocked(p.node, p.layer, p.page)) continue;
      // Another cache registered this block's page meanwhile: hold that one instead.
      const int32_t existing = index_.PageOf(p.node, p.layer);
      int32_t& refs = RefsLocked(existing);
      if (refs == 0) UnparkLocked(existing);
      if (++refs == 2) ++pages_shared_;
      unused.push_back(p.page);
      p.page = existing;
    }
  }
  if (!unused.empty()) Free(unused);
}

}  // namespace kvarena
