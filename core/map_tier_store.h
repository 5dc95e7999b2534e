// MapStore: a TierStore (core/tier_store.h) over a std::map, for tests and the fuzzers —
// unbounded unless `limit` is set (then a Put that does not fit evicts the oldest keys, in
// insertion order), with knobs to fail every call or the next n Puts, to hold Puts back
// (Pause: a writer waits in Put until Resume, so a test fills a queue behind it without
// sleeping) and to corrupt the values it holds.
// The real host and disk stores are in tiers/.
//
// Thread-safe.
#ifndef KVARENA_CORE_MAP_TIER_STORE_H_
#define KVARENA_CORE_MAP_TIER_STORE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/tier_store.h"

namespace kvarena {

class MapStore : public TierStore {
 public:
  explicit MapStore(std::string medium, uint64_t limit = 0)
      : medium_(std::move(medium)), limit_(limit) {}
  std::string medium() const override { return medium_; }
  absl::StatusOr<std::string> Get(const ChunkKey& key, absl::Time) override {
    absl::MutexLock lock(&mu_);
    ++gets_;
    if (fail_) return absl::UnavailableError("map store: failing");
    auto it = values_.find(key.Hex());
    if (it == values_.end()) return absl::NotFoundError("map store: no such key");
    return it->second;
  }
  bool Contains(const ChunkKey& key) override {
    absl::MutexLock lock(&mu_);
    return values_.contains(key.Hex());
  }
  absl::Status Put(const ChunkKey& key, absl::string_view value,
                   std::vector<EvictedChunk>* evicted) override {
    absl::MutexLock lock(&mu_);
    auto running = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !paused_; };
    mu_.Await(absl::Condition(&running));
    ++puts_;
    if (fail_) return absl::UnavailableError("map store: failing");
    if (fail_puts_ > 0) {
      --fail_puts_;
      return absl::UnavailableError("map store: failing this put");
    }
    if (limit_ > 0 && value.size() > limit_)
      return absl::ResourceExhaustedError("map store: too big");
    while (limit_ > 0 && !order_.empty() && bytes_ + value.size() > limit_) {
      const std::string old = order_.front();
      order_.erase(order_.begin());
      if (evicted != nullptr) evicted->push_back(EvictedChunk{keys_[old], values_[old]});
      bytes_ -= values_[old].size();
      values_.erase(old);
    }
    values_[key.Hex()] = std::string(value);
    keys_[key.Hex()] = key;
    order_.push_back(key.Hex());
    bytes_ += value.size();
    return absl::OkStatus();
  }
  void Erase(const ChunkKey& key) override {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(key.Hex());
    if (it == values_.end()) return;
    bytes_ -= it->second.size();
    values_.erase(it);
    order_.erase(std::find(order_.begin(), order_.end(), key.Hex()));
  }
  TierUsage Usage() const override {
    absl::MutexLock lock(&mu_);
    return TierUsage{bytes_, limit_, int64_t(values_.size()), !fail_};
  }

  size_t size() const {
    absl::MutexLock lock(&mu_);
    return values_.size();
  }
  int64_t gets() const {
    absl::MutexLock lock(&mu_);
    return gets_;
  }
  void set_fail(bool f) {
    absl::MutexLock lock(&mu_);
    fail_ = f;
  }
  // Fails the next n Puts (UNAVAILABLE, nothing stored), then stores again.
  void FailNextPuts(int n) {
    absl::MutexLock lock(&mu_);
    fail_puts_ = n;
  }
  // Puts called (failed ones included).
  int64_t puts() const {
    absl::MutexLock lock(&mu_);
    return puts_;
  }
  // Holds every Put back until Resume (Gets and the rest go on).
  void Pause() {
    absl::MutexLock lock(&mu_);
    paused_ = true;
  }
  void Resume() {
    absl::MutexLock lock(&mu_);
    paused_ = false;
  }
  // Applies f to every value (to corrupt them).
  void Mutate(const std::function<void(std::string*)>& f) {
    absl::MutexLock lock(&mu_);
    for (auto& [k, v] : values_) f(&v);
  }
  // Flips byte `at % size` of the (which % count)-th value in key order; false when empty.
  bool FlipByte(uint64_t which, uint64_t at, uint8_t mask = 1) {
    absl::MutexLock lock(&mu_);
    if (values_.empty()) return false;
    auto it = std::next(values_.begin(), std::ptrdiff_t(which % values_.size()));
    if (it->second.empty()) return false;
    it->second[size_t(at % it->second.size())] ^= char(mask == 0 ? 1 : mask);
    return true;
  }
  std::map<std::string, std::string> Values() const {
    absl::MutexLock lock(&mu_);
    return values_;
  }
  // Puts every chunk `other` holds (another node's view of one shared store).
  void CopyFrom(const MapStore& other) {
    std::vector<EvictedChunk> chunks;
    {
      absl::MutexLock lock(&other.mu_);
      for (const std::string& k : other.order_)
        chunks.push_back(EvictedChunk{other.keys_.at(k), other.values_.at(k)});
    }
    for (const EvictedChunk& c : chunks) (void)Put(c.key, c.value, nullptr);
  }
  void Replace(std::map<std::string, std::string> values) {
    absl::MutexLock lock(&mu_);
    for (auto& [k, v] : values) {
      if (values_.contains(k)) values_[k] = v;
    }
  }

 private:
  const std::string medium_;
  const uint64_t limit_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> values_;
  std::map<std::string, ChunkKey> keys_;
  std::vector<std::string> order_;
  uint64_t bytes_ = 0;
  int64_t gets_ = 0;
  int64_t puts_ = 0;
  int fail_puts_ = 0;
  bool fail_ = false;
  bool paused_ = false;
};

}  // namespace kvarena

#endif  // KVARENA_CORE_MAP_TIER_STORE_H_
