// LruIndex: the bookkeeping both local stores share — a map from ChunkKey to a value and
// its byte count, in least-recently-used order, with the byte total. It holds no lock and
// does no I/O: the store that owns one guards it with its own mutex and decides what a
// value is (the bytes themselves for the host store, nothing for the disk store, whose
// bytes are in files).
//
// Thread-compatible.
#ifndef KVARENA_TIERS_LRU_INDEX_H_
#define KVARENA_TIERS_LRU_INDEX_H_

#include <cstdint>
#include <iterator>
#include <list>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/tier_store.h"

namespace kvarena {

template <class V>
class LruIndex {
 public:
  struct Entry {
    ChunkKey key;
    V value;
    uint64_t bytes = 0;
  };

  LruIndex() = default;
  LruIndex(const LruIndex&) = delete;
  LruIndex& operator=(const LruIndex&) = delete;

  // The entry under key made the most recently used; null when absent. Valid until the
  // next call that removes it.
  Entry* Touch(const ChunkKey& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    lru_.splice(lru_.end(), lru_, it->second);
    return &*it->second;
  }
  // The entry under key without changing its recency; null when absent.
  const Entry* Find(const ChunkKey& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &*it->second;
  }
  bool Contains(const ChunkKey& key) const { return map_.contains(key); }

  // Adds key as the most recently used. REQUIRES: !Contains(key).
  void Insert(const ChunkKey& key, V value, uint64_t bytes) {
    lru_.push_back(Entry{key, std::move(value), bytes});
    map_.emplace(key, std::prev(lru_.end()));
    bytes_ += bytes;
  }
  // Removes key; its entry, or nullopt when absent.
  std::optional<Entry> Erase(const ChunkKey& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    Entry e = std::move(*it->second);
    lru_.erase(it->second);
    map_.erase(it);
    bytes_ -= e.bytes;
    return e;
  }
  // Removes and returns the least recently used entry. REQUIRES: !empty().
  Entry PopOldest() {
    Entry e = std::move(lru_.front());
    map_.erase(e.key);
    lru_.pop_front();
    bytes_ -= e.bytes;
    return e;
  }

  // Pops least recently used entries into *dropped until `bytes` more fit under limit
  // (bytes() <= limit - bytes). REQUIRES: bytes <= limit.
  void MakeRoom(uint64_t bytes, uint64_t limit, std::vector<Entry>* dropped) {
    while (!lru_.empty() && bytes_ > limit - bytes) dropped->push_back(PopOldest());
  }

  // What a store holding this index under `limit` reports.
  TierUsage Usage(uint64_t limit) const {
    TierUsage u;
    u.bytes_used = bytes_;
    u.bytes_limit = limit;
    u.chunks = size();
    return u;
  }

  uint64_t bytes() const { return bytes_; }
  int64_t size() const { return int64_t(lru_.size()); }
  bool empty() const { return lru_.empty(); }

 private:
  std::list<Entry> lru_;  // front: least recently used
  absl::flat_hash_map<ChunkKey, typename std::list<Entry>::iterator> map_;
  uint64_t bytes_ = 0;
};

}  // namespace kvarena

#endif  // KVARENA_TIERS_LRU_INDEX_H_
