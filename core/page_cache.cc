#include "core/page_cache.h"

#include <list>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace kvarena {
namespace {

class LruPageCache : public PageCache {
 public:
  LruPageCache(EvictCallback on_evict, std::atomic<uint64_t>* clock)
      : on_evict_(std::move(on_evict)), clock_(clock != nullptr ? clock : &own_clock_) {}

  void Insert(int32_t page) override {
    lru_.push_front(Entry{page, clock_->fetch_add(1, std::memory_order_relaxed)});
    where_.emplace(page, lru_.begin());
  }

  bool Lookup(int32_t page) const override { return where_.contains(page); }

  void Erase(int32_t page) override {
    auto it = where_.find(page);
    lru_.erase(it->second);
    where_.erase(it);
  }

  int32_t Evict() override {
    const int32_t page = lru_.back().page;
    Evict(page);
    return page;
  }

  void Evict(int32_t page) override {
    Erase(page);
    on_evict_(page);
  }

  int64_t size() const override { return int64_t(lru_.size()); }

  std::vector<int32_t> EvictionOrder() const override {
    std::vector<int32_t> out;
    out.reserve(lru_.size());
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) out.push_back(it->page);
    return out;
  }

  uint64_t OldestStamp() const override { return lru_.empty() ? kNoStamp : lru_.back().stamp; }

 private:
  struct Entry {
    int32_t page;
    uint64_t stamp;
  };
  const EvictCallback on_evict_;
  std::atomic<uint64_t> own_clock_{0};
  std::atomic<uint64_t>* const clock_;
  std::list<Entry> lru_;  // front: most recently inserted
  absl::flat_hash_map<int32_t, std::list<Entry>::iterator> where_;
};

}  // namespace

std::unique_ptr<PageCache> NewLruPageCache(PageCache::EvictCallback on_evict,
                                           std::atomic<uint64_t>* clock) {
  return std::make_unique<LruPageCache>(std::move(on_evict), clock);
}

}  // namespace kvarena
