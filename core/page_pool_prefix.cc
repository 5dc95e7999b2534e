// PagePool's prefix-reuse operations: chains of index nodes, lookup and adoption, and page
// registration (page_pool.h; the audit is page_pool_audit.cc).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/page_pool.h"

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
    chain->root = index_.HoldRoot(q.root_key, q.prefix_namespace, q.root_hash, q.num_layers);
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

}  // namespace kvarena
