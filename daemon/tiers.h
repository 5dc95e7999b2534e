// The daemon's tiers below the arena (docs/tiers.md): the --tier_* flags and the TierSet
// they make — a host tier (tiers/host_store.h), then a disk tier (tiers/disk_store.h), then
// a Redis Cluster shared by every node (tiers/redis/redis_store.h).
#ifndef KVARENA_DAEMON_TIERS_H_
#define KVARENA_DAEMON_TIERS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/tier_set.h"
#include "daemon/tier_metrics.h"
#include "tiers/redis/redis_store.h"

namespace kvarena {

// The flags of the tiers below the arena; each default here is its flag's (daemon/flags.cc).
struct TierFlags {
  uint64_t host_bytes = 0;     // --tier_host_bytes; 0: no host tier
  std::string disk_dir;        // --tier_disk_dir; "": no disk tier
  uint64_t disk_bytes = 0;     // --tier_disk_bytes (required with a disk dir)
  int chunk_pages = 0;         // --tier_chunk_pages; 0: the fewest making >= 256 KiB
  bool write_through = false;  // --tier_write_through
  absl::Duration timeout = absl::Milliseconds(200);  // --tier_timeout
  uint64_t write_queue_bytes = uint64_t{256} << 20;  // --tier_write_queue_bytes
  // The cluster tier (tiers/redis/, docs/redis-tier.md): write-through, below disk.
  std::string redis;                     // --tier_redis: HOST:PORT[,HOST:PORT...]; "": none
  std::string redis_user;                // --tier_redis_user (ACL)
  std::string redis_password_file;       // --tier_redis_password_file
  std::string redis_key_prefix = "kva";  // --tier_redis_key_prefix
  absl::Duration redis_ttl = absl::ZeroDuration();  // --tier_redis_ttl; 0: none
};

// What MakeTiers made: the set, and its Redis store (for its cluster counters) if any.
struct DaemonTiers {
  std::shared_ptr<TierSet> set;  // null: no tier
  const RedisStore* redis = nullptr;
};

// The tiers the flags ask for, top first; null when they ask for none. INVALID_ARGUMENT
// naming the flag for a bad combination; what opening the disk directory refused.
// latency (may be null) receives every store call's duration; it must outlive the set.
absl::StatusOr<DaemonTiers> MakeTiers(const TierFlags& flags, TierLatency* latency);

// " tiers=host:1073741824,disk:/var/kvarena:10737418240" for the start line; "" for none.
std::string DescribeTiers(const TierFlags& flags);

}  // namespace kvarena

#endif  // KVARENA_DAEMON_TIERS_H_
