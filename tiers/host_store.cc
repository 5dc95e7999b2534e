#include "tiers/host_store.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "tiers/lru_index.h"

namespace kvarena {
namespace {

// A value is shared so that Get copies it out after the lock is released, while a
// concurrent Put may drop it from the index. A Get takes its reference under the lock and
// gives it back under the lock, so a Put that finds a dropped value's count at 1 under
// the lock knows no Get reads it: that value is moved out, not copied.
using Value = std::shared_ptr<std::string>;

class HostStore final : public TierStore {
 public:
  explicit HostStore(uint64_t bytes_limit) : limit_(bytes_limit) {}

  std::string medium() const override { return "host"; }

  absl::StatusOr<std::string> Get(const ChunkKey& key, absl::Time /*deadline*/) override {
    Value v;
    {
      absl::MutexLock lock(&mu_);
      LruIndex<Value>::Entry* e = index_.Touch(key);
      if (e == nullptr) return absl::NotFoundError(absl::StrCat("host tier: no chunk ", key.Hex()));
      v = e->value;
    }
    std::string out = *v;
    Value last;  // freed after the lock, when this Get held a dropped value's last reference
    absl::MutexLock lock(&mu_);
    if (v.use_count() == 1) last = std::move(v);
    v.reset();
    return out;
  }

  bool Contains(const ChunkKey& key) override {
    absl::MutexLock lock(&mu_);
    return index_.Contains(key);
  }

  absl::Status Put(const ChunkKey& key, absl::string_view value,
                   std::vector<EvictedChunk>* evicted) override {
    if (value.size() > limit_) {
      return absl::ResourceExhaustedError(absl::StrCat("host tier: chunk ", key.Hex(), " of ",
                                                       value.size(), " bytes exceeds the limit of ",
                                                       limit_, " bytes"));
    }
    Value v = std::make_shared<std::string>(value);  // the copy, before the lock
    std::optional<LruIndex<Value>::Entry> replaced;  // released after the lock
    std::vector<LruIndex<Value>::Entry> dropped;
    std::vector<bool> unshared;  // per dropped value: no Get holds it
    {
      absl::MutexLock lock(&mu_);
      replaced = index_.Erase(key);
      index_.MakeRoom(value.size(), limit_, &dropped);
      index_.Insert(key, std::move(v), value.size());
      for (const LruIndex<Value>::Entry& e : dropped) unshared.push_back(e.value.use_count() == 1);
    }
    if (evicted != nullptr) {
      for (size_t i = 0; i < dropped.size(); ++i) {
        Value& d = dropped[i].value;
        evicted->push_back(EvictedChunk{dropped[i].key, unshared[i] ? std::move(*d) : *d});
      }
    }
    return absl::OkStatus();
  }

  void Erase(const ChunkKey& key) override {
    std::optional<LruIndex<Value>::Entry> erased;  // released after the lock
    absl::MutexLock lock(&mu_);
    erased = index_.Erase(key);
  }

  TierUsage Usage() const override {
    absl::MutexLock lock(&mu_);
    return index_.Usage(limit_);
  }

 private:
  const uint64_t limit_;
  mutable absl::Mutex mu_;
  LruIndex<Value> index_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<TierStore> NewHostStore(uint64_t bytes_limit) {
  return std::make_unique<HostStore>(bytes_limit);
}

}  // namespace kvarena
