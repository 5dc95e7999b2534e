#include "daemon/tiers.h"

#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/small_file.h"
#include "base/status_macros.h"
#include "tiers/disk_store.h"
#include "tiers/host_store.h"

namespace kvarena {

namespace {

// The cluster tier, or INVALID_ARGUMENT naming the flag.
absl::StatusOr<std::unique_ptr<RedisStore>> MakeRedis(const TierFlags& flags) {
  RedisStoreOptions o;
  o.seeds = flags.redis;
  o.user = flags.redis_user;
  o.key_prefix = flags.redis_key_prefix;
  o.ttl = flags.redis_ttl;
  if (!flags.redis_password_file.empty()) {
    absl::StatusOr<std::string> password = ReadSmallFile(flags.redis_password_file, 4096);
    if (!password.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tier_redis_password_file=", flags.redis_password_file, ": ",
                       password.status().message()));
    }
    o.password = std::string(absl::StripTrailingAsciiWhitespace(*password));
  }
  absl::StatusOr<std::unique_ptr<RedisStore>> store = RedisStore::Create(o);
  if (!store.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tier_redis=", flags.redis, ": ", store.status().message()));
  }
  return store;
}

}  // namespace

absl::StatusOr<DaemonTiers> MakeTiers(const TierFlags& flags, TierLatency* latency) {
  if (flags.chunk_pages < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tier_chunk_pages=", flags.chunk_pages,
                                                   " but it is 0 (the default) or more"));
  }
  if (flags.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tier_timeout=", absl::FormatDuration(flags.timeout),
                     " but a lookup needs some time: give more than 0"));
  }
  if (!flags.disk_dir.empty() && flags.disk_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tier_disk_dir=", flags.disk_dir,
                     " needs --tier_disk_bytes (how much of the disk it may fill)"));
  }
  if (flags.disk_dir.empty() && flags.disk_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tier_disk_bytes=", flags.disk_bytes,
                                                   " needs --tier_disk_dir (where the chunks go)"));
  }
  std::vector<TierEntry> stores;
  if (flags.host_bytes > 0) {
    stores.push_back(TierEntry{NewHostStore(flags.host_bytes), flags.write_through});
  }
  if (!flags.disk_dir.empty()) {
    KVARENA_ASSIGN_OR_RETURN(std::unique_ptr<TierStore> disk,
                             OpenDiskStore(flags.disk_dir, flags.disk_bytes));
    stores.push_back(TierEntry{std::move(disk), flags.write_through});
  }
  DaemonTiers out;
  if (!flags.redis.empty()) {
    KVARENA_ASSIGN_OR_RETURN(std::unique_ptr<RedisStore> redis, MakeRedis(flags));
    out.redis = redis.get();
    stores.push_back(
        TierEntry{std::move(redis), /*write_through=*/true});  // shared: every full chunk
  } else if (!flags.redis_user.empty() || !flags.redis_password_file.empty()) {
    return absl::InvalidArgumentError(
        "--tier_redis_user and --tier_redis_password_file need --tier_redis");
  }
  if (stores.empty()) return out;
  TierOptions options;
  options.chunk_pages = flags.chunk_pages;
  options.write_queue_bytes = flags.write_queue_bytes;
  options.timeout = flags.timeout;
  if (latency != nullptr) {
    options.on_latency = [latency](const std::string& medium, bool write, absl::Duration took) {
      latency->Record(medium, write, took);
    };
  }
  out.set = std::make_shared<TierSet>(std::move(stores), std::move(options));
  return out;
}

std::string DescribeTiers(const TierFlags& flags) {
  std::vector<std::string> parts;
  if (flags.host_bytes > 0) parts.push_back(absl::StrCat("host:", flags.host_bytes));
  if (!flags.disk_dir.empty())
    parts.push_back(absl::StrCat("disk:", flags.disk_dir, ":", flags.disk_bytes));
  if (!flags.redis.empty()) parts.push_back(absl::StrCat("redis:", flags.redis));
  if (parts.empty()) return "";
  return absl::StrCat(" tiers=", absl::StrJoin(parts, ","),
                      flags.write_through ? " write_through" : "");
}

}  // namespace kvarena
