// RedisStore: the TierStore over a Redis Cluster (or one non-cluster Redis), medium "redis"
// (docs/redis-tier.md). A chunk is kept under "<key_prefix>:{<32 hex digits of its key>}":
// the braces are a hash tag, so every key of one chunk lands in one slot. Values are opaque
// bytes here; TierSet verifies what Get returns. Put is content-addressed and one round
// trip for a new chunk (SET ... NX PX); one Redis already has is left as it is (counted in
// already_present(), its ttl renewed). Redis makes room itself (maxmemory with
// allkeys-lru, or the ttl, renewed by each Get and Put of the chunk): Put never hands
// evicted values on. A key holding a value of another Redis type reads as DATA_LOSS, so the
// tier erases it.
//
// Thread-safety: safe for concurrent use; no lock of this store is held across a network
// call (the cluster client's own locking is in redis_cluster.h).
#ifndef KVARENA_TIERS_REDIS_REDIS_STORE_H_
#define KVARENA_TIERS_REDIS_REDIS_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "core/tier_store.h"
#include "tiers/redis/redis_cluster.h"

namespace kvarena {

struct RedisStoreOptions {
  std::string seeds;     // "HOST:PORT[,HOST:PORT...]": cluster nodes, or one plain Redis
  std::string user;      // ACL user ("": AUTH with the password alone)
  std::string password;  // "": no AUTH
  std::string key_prefix = "kva";
  absl::Duration ttl = absl::ZeroDuration();  // PX on each SET; 0: none
  absl::Duration connect_timeout = absl::Milliseconds(200);
  // Each read or write; also the deadline of Put, Contains and Erase.
  absl::Duration command_timeout = absl::Milliseconds(500);
  absl::Duration breaker_period = absl::Seconds(1);
  // Where the store reads the time for what it decides by it: the breakers' periods and
  // when the ttl expires a chunk it remembers (Usage). Deadlines and timeouts are real
  // time. Outlives the store; tests pass a FakeClock.
  Clock* clock = RealClock();
};

class RedisStore : public TierStore {
 public:
  // INVALID_ARGUMENT for options that cannot work (no seeds, a seed not HOST:PORT, a
  // key_prefix empty or holding '{' or '}', a negative ttl, a timeout not positive, no
  // clock). An
  // unreachable cluster is not an error: the store starts down and comes up by itself.
  static absl::StatusOr<std::unique_ptr<RedisStore>> Create(const RedisStoreOptions& options);

  std::string medium() const override { return "redis"; }
  // With a ttl, a Get renews the chunk's expiry (GETEX ... PX), as a Put of a chunk
  // already there does (PEXPIRE).
  absl::StatusOr<std::string> Get(const ChunkKey& key, absl::Time deadline) override;
  // Get of several chunks at once, pipelined per node: one result per key, in order.
  std::vector<absl::StatusOr<std::string>> GetMany(const std::vector<ChunkKey>& keys,
                                                   absl::Time deadline);
  bool Contains(const ChunkKey& key) override;
  absl::Status Put(const ChunkKey& key, absl::string_view value,
                   std::vector<EvictedChunk>* evicted) override;
  void Erase(const ChunkKey& key) override;
  TierUsage Usage() const override;

  // The most recent failure's message, for an operator ("" when none).
  std::string last_error() const { return cluster_->last_error(); }
  RedisCounterValues cluster_counters() const { return cluster_->counters(); }
  // Puts that found the chunk already stored and sent nothing.
  int64_t already_present() const { return already_present_.load(std::memory_order_relaxed); }
  // The Redis key of a chunk.
  std::string RedisKey(const ChunkKey& key) const;
  RedisCluster& TEST_cluster() { return *cluster_; }

 private:
  RedisStore(const RedisStoreOptions& options, std::unique_ptr<RedisCluster> cluster);
  // A GET's reply as Get returns it (NOT_FOUND for nil; DATA_LOSS for a key of another
  // Redis type; INTERNAL for a reply of a wrong type).
  absl::StatusOr<std::string> ValueOf(const ChunkKey& key, const std::string& k,
                                      absl::StatusOr<RedisReply> reply);
  std::string TtlMillis() const;
  void Remember(const ChunkKey& key, uint64_t size);
  void Forget(const ChunkKey& key);
  // Drops what the ttl has expired by `now` (options_.clock's).
  void ForgetExpiredLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RedisStoreOptions options_;
  const std::unique_ptr<RedisCluster> cluster_;
  std::atomic<int64_t> already_present_{0};

  // The chunks this store wrote or read and has not seen gone, with when the ttl expires
  // them: Usage's figures. Other writers' chunks are not in them; what the ttl expired is
  // dropped as its time passes, so they never count a chunk past its expiry; without a
  // ttl, what maxmemory evicted leaves them at the next Get of it. Expiry is read on
  // options_.clock: a chunk leaves them when that clock passes its ttl, even if Redis,
  // on its own clock, still holds it.
  struct Known {
    uint64_t size = 0;
    absl::Time expires;  // InfiniteFuture without a ttl
  };
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<ChunkKey, Known> sizes_ ABSL_GUARDED_BY(mu_);
  // (expiry, key low, key high) of every chunk a ttl expires, soonest first.
  mutable std::set<std::tuple<absl::Time, uint64_t, uint64_t>> expiring_ ABSL_GUARDED_BY(mu_);
  mutable uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// The store as the tier seam sees it (RedisStore::Create).
absl::StatusOr<std::unique_ptr<TierStore>> NewRedisStore(const RedisStoreOptions& options);

}  // namespace kvarena

#endif  // KVARENA_TIERS_REDIS_REDIS_STORE_H_
