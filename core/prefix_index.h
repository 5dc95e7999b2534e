// PrefixIndex: the content-addressed pages of one pool, for prefix reuse across caches
// (docs/prefix-reuse.md). A tree of nodes, one per distinct (namespace, token prefix)
// ending at a page boundary: a root per namespace and geometry, and below it one node per
// full page of token ids, found by its chained hash (core/prefix_hash.h). A node names
// at most one page per layer, the page that holds that layer's K/V of the node's tokens.
//
// A hash only proposes a node: a node is the child of `parent` for tokens t only when it
// records exactly that parent and those token ids, so two prefixes whose hashes collide
// never share a node (the second finds the slot taken and is not indexed). With every
// node reached through verified parents from a root found by its exact namespace string,
// a node's K/V belong to exactly its namespace and full token prefix.
//
// Lifetimes: a node lives while it names a page, has a child or is held by a cache that
// declared its tokens (PrefixChain); the last of them going deletes it, and its parent
// may follow. A registered page lives while caches reference it (counted by the pool);
// when the last reference drops it is reclaimable, still indexed, in the pool's PageCache
// (core/page_cache.h), until a cache adopts it again or the cache evicts it, which
// unregisters it.
//
// Memory: each node is charged to the metadata budget given at construction (NodeBytes)
// while it lives; a node the budget cannot cover is not created (HoldRoot / HoldChild
// return kNoNode, as for a collision), so the index never holds more than the budget.
// The bytes of nodes no cache holds (kept only by cached pages or by children: a cached
// prefix) are also counted apart, in unheld_bytes() and in the arena-wide counter given
// at construction, so the arena can bound what cached prefixes keep of the budget.
//
// Not thread-safe: the owning PagePool's lock guards it.
#ifndef KVARENA_CORE_PREFIX_INDEX_H_
#define KVARENA_CORE_PREFIX_INDEX_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "core/byte_budget.h"
#include "core/prefix_hash.h"

namespace kvarena {

class PrefixIndex {
 public:
  static constexpr uint64_t kNoNode = 0;

  // metadata (may be null: no bound) and unheld (may be null: the arena-wide count of
  // unheld nodes' bytes, which this index adds its own to) must outlive the index.
  explicit PrefixIndex(ByteBudget* metadata = nullptr, std::atomic<size_t>* unheld = nullptr)
      : metadata_(metadata), arena_unheld_(unheld) {}
  ~PrefixIndex();
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // The metadata bytes one node of a chain costs: the node, its token ids, its per-layer
  // page slots and its entries in the index's maps.
  static size_t NodeBytes(int num_layers, int page_size);

  // Holds the root of `key` (an exact encoding of namespace and geometry), created when
  // new. kNoNode, holding nothing, when the metadata budget cannot cover a new root.
  uint64_t HoldRoot(const std::string& key, const std::string& prefix_namespace,
                    uint64_t scales_digest, const Hash128& hash, int num_layers);
  // Holds the child of `parent` (a held node) for page hash h and tokens[0..n), created
  // when new. kNoNode, holding nothing, when h names another node (a collision) or the
  // metadata budget cannot cover a new node.
  uint64_t HoldChild(uint64_t parent, const Hash128& h, const int32_t* tokens, int n);
  void Hold(uint64_t node);
  // Drops one hold; may delete the node and then its unused ancestors.
  void Unhold(uint64_t node);

  // The page node names for `layer`, or -1.
  int32_t PageOf(uint64_t node, int layer) const;
  const Hash128& HashOf(uint64_t node) const;
  // The hash of node's parent (a root's own hash for the first page of a chain) and the
  // node's token ids, for events.
  const Hash128& ParentHashOf(uint64_t node) const;
  const std::vector<int32_t>& TokensOf(uint64_t node) const { return nodes_.at(node).tokens; }
  // The namespace of the root node descends from.
  const std::string& NamespaceOf(uint64_t node) const;
  // The static scales' digest of node's root.
  uint64_t ScalesDigestOf(uint64_t node) const;
  // The node's block index in its chain (0: the first page's node; -1: a root), its
  // parent (kNoNode for a root) and how many layers its chain's caches have.
  int64_t BlockOf(uint64_t node) const { return nodes_.at(node).block; }
  uint64_t ParentOf(uint64_t node) const { return nodes_.at(node).parent; }
  // The child most recently created or held under node (kNoNode: none left): the one
  // continuation a chunk's tiers capture can follow down (nodes keep no child lists).
  uint64_t LastChildOf(uint64_t node) const { return nodes_.at(node).last_child; }
  int NumLayersOf(uint64_t node) const { return int(nodes_.at(node).pages.size()); }
  // Tiers (core/tier_set.h): the key of the last chunk holding this node that was handed
  // to the tiers (null before any), and how it went — kTierFull (a write-through copy of
  // the full chunk), kTierEvicted (written back on eviction) — so each is done once.
  static constexpr uint8_t kTierFull = 1, kTierEvicted = 2;
  const Hash128* TierKeyOf(uint64_t node) const {
    const Node& n = nodes_.at(node);
    return n.tier_flags != 0 ? &n.tier_key : nullptr;
  }
  uint8_t TierFlagsOf(uint64_t node) const { return nodes_.at(node).tier_flags; }
  void MarkTiered(uint64_t node, const Hash128& key, uint8_t flag) {
    Node& n = At(node);
    n.tier_flags |= flag;
    n.tier_key = key;
  }
  // Undoes MarkTiered's `flag` (no store took the chunk: it is eligible again).
  void ClearTiered(uint64_t node, uint8_t flag) { At(node).tier_flags &= uint8_t(~flag); }
  // Whether node is still in the index (a chunk handed back to the pool may be gone).
  bool Contains(uint64_t node) const { return nodes_.contains(node); }
  // The node a registered page belongs to. REQUIRES: IsRegistered(page).
  uint64_t NodeOfPage(int32_t page) const { return pages_.at(page).node; }
  // The node's hash and the layer a registered page is indexed under.
  std::pair<Hash128, int> KeyOfPage(int32_t page) const;
  // Makes `page` node's page for layer. False (nothing changes) when the node already
  // names one for that layer or the page is registered.
  bool Register(uint64_t node, int layer, int32_t page);
  bool IsRegistered(int32_t page) const { return pages_.contains(page); }

  // Unregisters a page: its node names it no more, and goes when nothing else keeps it.
  // REQUIRES: IsRegistered(page).
  void Unregister(int32_t page);

  int64_t nodes() const { return int64_t(nodes_.size()); }
  // NodeBytes of the nodes no cache holds.
  size_t unheld_bytes() const { return unheld_bytes_; }
  // Of those, the bytes that unregistering every page `referenced` says no cache uses
  // would free: an unheld node goes with its pages unless one of them, or of its
  // descendants', is referenced. O(registered pages + nodes).
  size_t FreeableBytes(const std::function<bool(int32_t page)>& referenced) const;
  // What the nodes are charged: NodeBytes of each.
  size_t TEST_NodeBytes() const;
  int64_t registered() const { return int64_t(pages_.size()); }
  // INTERNAL naming the first inconsistency: holds and children counts against `holds`
  // (node -> holds the caches declare), every page's node naming it back, no node left
  // that nothing keeps, and tier flags only on a page's node (not a root), with a key,
  // and only those of `tier_flags` (the kinds of chunk the pool's tiers take).
  absl::Status TEST_Audit(const absl::flat_hash_map<uint64_t, int64_t>& holds,
                          uint8_t tier_flags = 0) const;

 private:
  struct Node {
    Hash128 hash;
    uint64_t parent = kNoNode;
    uint64_t root = kNoNode;  // itself for a root: it outlives every descendant
    uint64_t last_child = kNoNode;
    std::vector<int32_t> tokens;   // empty for a root
    std::vector<int32_t> pages;    // per layer; -1 none
    std::string root_key;          // roots only
    std::string prefix_namespace;  // roots only
    uint64_t scales_digest = 0;    // roots only (core/prefix_hash.h)
    int64_t holds = 0;
    int64_t block = -1;  // position in the chain; -1 for a root
    int32_t children = 0;
    int32_t num_pages = 0;
    uint8_t tier_flags = 0;  // kTierFull | kTierEvicted
    Hash128 tier_key;
  };
  struct PageEntry {
    uint64_t node = kNoNode;
    int layer = 0;
  };

  Node& At(uint64_t node) { return nodes_.at(node); }
  static size_t BytesOf(const Node& n) {
    return NodeBytes(int(n.pages.size()), int(n.tokens.size()));
  }
  // One more hold on n (counted as held from its first).
  void HoldNode(Node& n);
  // Moves n's bytes into or out of the unheld count.
  void CountUnheld(const Node& n, bool unheld);
  // Charges the metadata budget for a new node; false when it does not fit.
  bool ChargeNode(int num_layers, int page_size);
  // Deletes node and then each ancestor that nothing keeps any more.
  void DeleteIfUnused(uint64_t node);

  ByteBudget* const metadata_;
  std::atomic<size_t>* const arena_unheld_;
  size_t unheld_bytes_ = 0;
  uint64_t next_serial_ = 1;
  absl::flat_hash_map<uint64_t, Node> nodes_;
  absl::flat_hash_map<std::string, uint64_t> roots_;
  absl::flat_hash_map<Hash128, uint64_t> by_hash_;  // non-root nodes
  absl::flat_hash_map<int32_t, PageEntry> pages_;   // registered pages
};

}  // namespace kvarena

#endif  // KVARENA_CORE_PREFIX_INDEX_H_
