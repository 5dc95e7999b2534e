#include "core/prefix_index.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace kvarena {

PrefixIndex::~PrefixIndex() {
  if (arena_unheld_ != nullptr) arena_unheld_->fetch_sub(unheld_bytes_, std::memory_order_relaxed);
  if (metadata_ == nullptr) return;
  for (const auto& [serial, n] : nodes_) metadata_->Refund(BytesOf(n));
}

void PrefixIndex::CountUnheld(const Node& n, bool unheld) {
  const size_t bytes = BytesOf(n);
  if (unheld) {
    unheld_bytes_ += bytes;
    if (arena_unheld_ != nullptr) arena_unheld_->fetch_add(bytes, std::memory_order_relaxed);
  } else {
    unheld_bytes_ -= bytes;
    if (arena_unheld_ != nullptr) arena_unheld_->fetch_sub(bytes, std::memory_order_relaxed);
  }
}

void PrefixIndex::HoldNode(Node& n) {
  if (n.holds++ == 0) CountUnheld(n, false);
}

size_t PrefixIndex::NodeBytes(int num_layers, int page_size) {
  // A flat_hash_map slot is the entry plus a control byte; at its lowest load (7/16 after
  // a growth) a map holds about 2.3 slots per entry. Vectors hold what they were assigned.
  constexpr size_t kSlotsPerEntry = 3;
  const size_t node_slot = sizeof(uint64_t) + sizeof(Node) + 1;
  const size_t hash_slot = sizeof(Hash128) + sizeof(uint64_t) + 1;
  return kSlotsPerEntry * (node_slot + hash_slot) + size_t(page_size) * sizeof(int32_t) +
         size_t(num_layers) * sizeof(int32_t);
}

bool PrefixIndex::ChargeNode(int num_layers, int page_size) {
  return metadata_ == nullptr || metadata_->TryCharge(NodeBytes(num_layers, page_size));
}

uint64_t PrefixIndex::HoldRoot(const std::string& key, const std::string& prefix_namespace,
                               uint64_t scales_digest, const Hash128& hash, int num_layers) {
  auto it = roots_.find(key);
  if (it != roots_.end()) {
    HoldNode(At(it->second));
    return it->second;
  }
  if (!ChargeNode(num_layers, 0)) return kNoNode;
  const uint64_t serial = next_serial_++;
  Node& n = nodes_[serial];
  n.hash = hash;
  n.root = serial;
  n.root_key = key;
  n.prefix_namespace = prefix_namespace;
  n.scales_digest = scales_digest;
  n.pages.assign(size_t(num_layers), -1);
  n.holds = 1;
  roots_.emplace(key, serial);
  return serial;
}

uint64_t PrefixIndex::HoldChild(uint64_t parent, const Hash128& h, const int32_t* tokens, int n) {
  auto it = by_hash_.find(h);
  if (it != by_hash_.end()) {
    Node& node = At(it->second);
    if (node.parent != parent ||
        !std::equal(node.tokens.begin(), node.tokens.end(), tokens, tokens + n) ||
        int(node.tokens.size()) != n) {
      return kNoNode;  // the hash names another prefix
    }
    HoldNode(node);
    At(parent).last_child = it->second;
    return it->second;
  }
  if (!ChargeNode(int(At(parent).pages.size()), n)) return kNoNode;
  const uint64_t serial = next_serial_++;
  Node& p = At(parent);
  ++p.children;
  Node& node = nodes_[serial];
  node.hash = h;
  node.parent = parent;
  node.root = At(parent).root;
  node.block = At(parent).block + 1;
  At(parent).last_child = serial;
  node.tokens.assign(tokens, tokens + n);
  node.pages.assign(At(parent).pages.size(), -1);
  node.holds = 1;
  by_hash_.emplace(h, serial);
  return serial;
}

void PrefixIndex::Hold(uint64_t node) { HoldNode(At(node)); }

void PrefixIndex::Unhold(uint64_t node) {
  Node& n = At(node);
  if (--n.holds == 0) CountUnheld(n, true);
  DeleteIfUnused(node);
}

void PrefixIndex::DeleteIfUnused(uint64_t node) {
  while (node != kNoNode) {
    auto it = nodes_.find(node);
    const Node& n = it->second;
    if (n.holds > 0 || n.children > 0 || n.num_pages > 0) return;
    const uint64_t parent = n.parent;
    if (parent == kNoNode) {
      roots_.erase(n.root_key);
    } else {
      by_hash_.erase(n.hash);
      Node& p = At(parent);
      --p.children;
      if (p.last_child == node) p.last_child = kNoNode;
    }
    CountUnheld(n, false);  // nothing holds a node that goes
    if (metadata_ != nullptr) metadata_->Refund(BytesOf(n));
    nodes_.erase(it);
    node = parent;
  }
}

int32_t PrefixIndex::PageOf(uint64_t node, int layer) const {
  return nodes_.at(node).pages[size_t(layer)];
}

const Hash128& PrefixIndex::HashOf(uint64_t node) const { return nodes_.at(node).hash; }

const Hash128& PrefixIndex::ParentHashOf(uint64_t node) const {
  const Node& n = nodes_.at(node);
  return n.parent == kNoNode ? n.hash : nodes_.at(n.parent).hash;
}

const std::string& PrefixIndex::NamespaceOf(uint64_t node) const {
  return nodes_.at(nodes_.at(node).root).prefix_namespace;
}

uint64_t PrefixIndex::ScalesDigestOf(uint64_t node) const {
  return nodes_.at(nodes_.at(node).root).scales_digest;
}

std::pair<Hash128, int> PrefixIndex::KeyOfPage(int32_t page) const {
  const PageEntry& e = pages_.at(page);
  return {nodes_.at(e.node).hash, e.layer};
}

bool PrefixIndex::Register(uint64_t node, int layer, int32_t page) {
  Node& n = At(node);
  if (n.pages[size_t(layer)] >= 0 || pages_.contains(page)) return false;
  n.pages[size_t(layer)] = page;
  ++n.num_pages;
  PageEntry& e = pages_[page];
  e.node = node;
  e.layer = layer;
  return true;
}

void PrefixIndex::Unregister(int32_t page) {
  auto it = pages_.find(page);
  const uint64_t node = it->second.node;
  Node& n = At(node);
  n.pages[size_t(it->second.layer)] = -1;
  --n.num_pages;
  pages_.erase(it);
  DeleteIfUnused(node);
}

size_t PrefixIndex::FreeableBytes(const std::function<bool(int32_t page)>& referenced) const {
  // An unheld node with a referenced page stays, and so does each of its ancestors (kept
  // by their child); every node above a held one is held too, so the walk stops there.
  absl::flat_hash_set<uint64_t> pinned;
  size_t pinned_bytes = 0;
  for (const auto& [page, entry] : pages_) {
    if (!referenced(page)) continue;
    for (uint64_t n = entry.node; n != kNoNode;) {
      const Node& node = nodes_.at(n);
      if (node.holds > 0 || !pinned.insert(n).second) break;
      pinned_bytes += BytesOf(node);
      n = node.parent;
    }
  }
  return unheld_bytes_ - pinned_bytes;
}

size_t PrefixIndex::TEST_NodeBytes() const {
  size_t bytes = 0;
  for (const auto& [serial, n] : nodes_) bytes += BytesOf(n);
  return bytes;
}

absl::Status PrefixIndex::TEST_Audit(const absl::flat_hash_map<uint64_t, int64_t>& holds,
                                     uint8_t tier_flags) const {
  absl::flat_hash_map<uint64_t, int32_t> children;
  for (const auto& [serial, n] : nodes_) {
    if (n.parent != kNoNode) ++children[n.parent];
  }
  for (const auto& [serial, n] : nodes_) {
    if (n.parent != kNoNode) {
      if (!nodes_.contains(n.parent))
        return absl::InternalError(absl::StrCat("node ", serial, " has a deleted parent"));
      auto h = by_hash_.find(n.hash);
      if (h == by_hash_.end() || h->second != serial) {
        return absl::InternalError(absl::StrCat("node ", serial, " is not indexed by its hash"));
      }
    } else {
      auto r = roots_.find(n.root_key);
      if (r == roots_.end() || r->second != serial) {
        return absl::InternalError(absl::StrCat("root ", serial, " is not indexed by its key"));
      }
    }
    int32_t pages = 0;
    for (size_t l = 0; l < n.pages.size(); ++l) {
      if (n.pages[l] < 0) continue;
      ++pages;
      auto e = pages_.find(n.pages[l]);
      if (e == pages_.end() || e->second.node != serial || e->second.layer != int(l)) {
        return absl::InternalError(absl::StrCat("node ", serial, " names page ", n.pages[l],
                                                " for layer ", l,
                                                " but the page is registered elsewhere"));
      }
    }
    if (pages != n.num_pages) {
      return absl::InternalError(
          absl::StrCat("node ", serial, " counts ", n.num_pages, " pages but names ", pages));
    }
    auto want = holds.find(serial);
    const int64_t held = want == holds.end() ? 0 : want->second;
    if (held != n.holds) {
      return absl::InternalError(absl::StrCat("node ", serial, " counts ", n.holds,
                                              " holds but caches hold it ", held, " times"));
    }
    auto c = children.find(serial);
    if ((c == children.end() ? 0 : c->second) != n.children) {
      return absl::InternalError(
          absl::StrCat("node ", serial, " counts ", n.children, " children"));
    }
    if (n.tier_flags != 0) {
      if ((n.tier_flags & ~tier_flags) != 0) {
        return absl::InternalError(
            absl::StrCat("node ", serial, " has tier flags ", int(n.tier_flags),
                         " but its pool's tiers take only ", int(tier_flags)));
      }
      if (n.block < 0 || n.tier_key == Hash128()) {
        return absl::InternalError(
            absl::StrCat("node ", serial, " (block ", n.block, ") has tier flags ",
                         int(n.tier_flags), n.block < 0 ? " on a root" : " without a tier key"));
      }
    }
    if (n.holds == 0 && n.num_pages == 0 && n.children == 0) {
      return absl::InternalError(absl::StrCat("node ", serial, " is kept by nothing"));
    }
  }
  for (const auto& [serial, count] : holds) {
    if (count > 0 && !nodes_.contains(serial)) {
      return absl::InternalError(absl::StrCat("a cache holds deleted node ", serial));
    }
  }
  size_t unheld = 0;
  for (const auto& [serial, n] : nodes_) unheld += n.holds == 0 ? BytesOf(n) : 0;
  if (unheld != unheld_bytes_) {
    return absl::InternalError(absl::StrCat("the unheld nodes take ", unheld,
                                            " bytes but the index counts ", unheld_bytes_));
  }
  if (by_hash_.size() + roots_.size() != nodes_.size()) {
    return absl::InternalError("the hash and root maps do not cover the nodes exactly");
  }
  return absl::OkStatus();
}

}  // namespace kvarena
