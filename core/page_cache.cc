#include "core/page_cache.h"

#include <list>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace kvarena {
namespace {

class LruPageCache : public PageCache {
 public:
  explicit LruPageCache(EvictCallback on_evict) : on_evict_(std::move(on_evict)) {}

  void Insert(int32_t page) override {
    lru_.push_front(page);
    where_.emplace(page, lru_.begin());
  }

  bool Lookup(int32_t page) const override { return where_.contains(page); }

  void Erase(int32_t page) override {
    auto it = where_.find(page);
    lru_.erase(it->second);
    where_.erase(it);
  }

  int32_t Evict() override {
    const int32_t page = lru_.back();
    Evict(page);
    return page;
  }

  void Evict(int32_t page) override {
    Erase(page);
    on_evict_(page);
  }

  int64_t size() const override { return int64_t(lru_.size()); }

  std::vector<int32_t> EvictionOrder() const override {
    return std::vector<int32_t>(lru_.rbegin(), lru_.rend());
  }

 private:
  const EvictCallback on_evict_;
  std::list<int32_t> lru_;  // front: most recently inserted
  absl::flat_hash_map<int32_t, std::list<int32_t>::iterator> where_;
};

}  // namespace

std::unique_ptr<PageCache> NewLruPageCache(PageCache::EvictCallback on_evict) {
  return std::make_unique<LruPageCache>(std::move(on_evict));
}

}  // namespace kvarena
