#include "tiers/redis/redis_store.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"

namespace kvarena {
namespace {

const char* TypeName(RedisReply::Type type) {
  switch (type) {
    case RedisReply::Type::kNil:
      return "nil";
    case RedisReply::Type::kString:
      return "bulk string";
    case RedisReply::Type::kStatus:
      return "status";
    case RedisReply::Type::kError:
      return "error";
    case RedisReply::Type::kInteger:
      return "integer";
    case RedisReply::Type::kArray:
      return "array";
  }
  return "unknown";
}

absl::Status Unexpected(RedisCluster& cluster, absl::string_view command, const std::string& key,
                        const RedisReply& r) {
  absl::Status status = absl::InternalError(
      absl::StrCat("redis ", command, " ", key, ": unexpected ", TypeName(r.type), " reply"));
  cluster.NoteError(status);
  return status;
}

absl::Status CheckPositive(absl::string_view field, absl::Duration d) {
  if (d > absl::ZeroDuration()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("redis ", field, "=", absl::FormatDuration(d), ": must be positive"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisStore>> RedisStore::Create(const RedisStoreOptions& options) {
  RedisClusterOptions cluster;
  for (absl::string_view seed : absl::StrSplit(options.seeds, ',', absl::SkipWhitespace())) {
    KVARENA_ASSIGN_OR_RETURN(RedisAddress address,
                             ParseRedisAddress(absl::StripAsciiWhitespace(seed), "redis seeds"));
    cluster.seeds.push_back(std::move(address));
  }
  if (cluster.seeds.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("redis seeds=\"", options.seeds, "\": expected HOST:PORT[,HOST:PORT...]"));
  }
  if (options.key_prefix.empty() || options.key_prefix.find_first_of("{}") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("redis key_prefix=\"", options.key_prefix,
                                                   "\": must be non-empty, without '{' or '}'"));
  }
  if (options.ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("redis ttl=", absl::FormatDuration(options.ttl),
                                                   ": must be 0 (none) or positive"));
  }
  KVARENA_RETURN_IF_ERROR(CheckPositive("connect_timeout", options.connect_timeout));
  KVARENA_RETURN_IF_ERROR(CheckPositive("command_timeout", options.command_timeout));
  KVARENA_RETURN_IF_ERROR(CheckPositive("breaker_period", options.breaker_period));
  if (options.clock == nullptr) {
    return absl::InvalidArgumentError("redis clock: null (RealClock() is the system's)");
  }
  cluster.connect.user = options.user;
  cluster.connect.password = options.password;
  cluster.connect.connect_timeout = options.connect_timeout;
  cluster.connect.command_timeout = options.command_timeout;
  cluster.connect.breaker_period = options.breaker_period;
  cluster.connect.clock = options.clock;
  KVARENA_ASSIGN_OR_RETURN(std::unique_ptr<RedisCluster> client,
                           RedisCluster::Create(std::move(cluster)));
  return std::unique_ptr<RedisStore>(new RedisStore(options, std::move(client)));
}

RedisStore::RedisStore(const RedisStoreOptions& options, std::unique_ptr<RedisCluster> cluster)
    : options_(options), cluster_(std::move(cluster)) {}

std::string RedisStore::RedisKey(const ChunkKey& key) const {
  return absl::StrCat(options_.key_prefix, ":{", key.Hex(), "}");
}

void RedisStore::Remember(const ChunkKey& key, uint64_t size) {
  const absl::Time now = options_.clock->Now();
  // Redis set or renewed the expiry before this, so it expires no later than this says.
  const absl::Time expires =
      options_.ttl > absl::ZeroDuration() ? now + options_.ttl : absl::InfiniteFuture();
  absl::MutexLock lock(&mu_);
  ForgetExpiredLocked(now);
  auto [it, added] = sizes_.try_emplace(key, Known{size, expires});
  if (!added) {
    bytes_ -= it->second.size;
    expiring_.erase({it->second.expires, key.low, key.high});
    it->second = Known{size, expires};
  }
  bytes_ += size;
  if (expires != absl::InfiniteFuture()) expiring_.insert({expires, key.low, key.high});
}

void RedisStore::Forget(const ChunkKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = sizes_.find(key);
  if (it == sizes_.end()) return;
  bytes_ -= it->second.size;
  expiring_.erase({it->second.expires, key.low, key.high});
  sizes_.erase(it);
}

void RedisStore::ForgetExpiredLocked(absl::Time now) const {
  while (!expiring_.empty() && std::get<0>(*expiring_.begin()) <= now) {
    const auto& [at, low, high] = *expiring_.begin();
    auto it = sizes_.find(ChunkKey{low, high});
    bytes_ -= it->second.size;
    sizes_.erase(it);
    expiring_.erase(expiring_.begin());
  }
}

std::string RedisStore::TtlMillis() const {
  return absl::StrCat(std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.ttl)));
}

absl::StatusOr<std::string> RedisStore::ValueOf(const ChunkKey& key, const std::string& k,
                                                absl::StatusOr<RedisReply> reply) {
  // DATA_LOSS: a key of another Redis type (redis_cluster.cc), which the tier erases.
  if (absl::IsDataLoss(reply.status())) Forget(key);
  KVARENA_RETURN_IF_ERROR(reply.status());
  if (reply->type == RedisReply::Type::kNil) {
    Forget(key);  // evicted or expired by Redis, or never stored
    return absl::NotFoundError(absl::StrCat("redis GET ", k, ": no such key"));
  }
  if (reply->type != RedisReply::Type::kString) return Unexpected(*cluster_, "GET", k, *reply);
  Remember(key, reply->str.size());
  return std::move(reply->str);
}

std::vector<absl::StatusOr<std::string>> RedisStore::GetMany(const std::vector<ChunkKey>& keys,
                                                             absl::Time deadline) {
  std::vector<RedisCommand> commands;
  commands.reserve(keys.size());
  for (const ChunkKey& key : keys) {
    std::string k = RedisKey(key);
    // With a ttl, a read renews it (GETEX): a chunk in use does not expire.
    RedisArgv argv = options_.ttl > absl::ZeroDuration() ? RedisArgv{"GETEX", k, "PX", TtlMillis()}
                                                         : RedisArgv{"GET", k};
    commands.push_back({std::move(k), std::move(argv)});
  }
  std::vector<absl::StatusOr<RedisReply>> replies = cluster_->Run(commands, deadline);
  std::vector<absl::StatusOr<std::string>> values;
  values.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    values.push_back(ValueOf(keys[i], commands[i].key, std::move(replies[i])));
  }
  return values;
}

absl::StatusOr<std::string> RedisStore::Get(const ChunkKey& key, absl::Time deadline) {
  return std::move(GetMany({key}, deadline)[0]);
}

// The deadlines below bound real socket waits: the system clock, never options_.clock.
bool RedisStore::Contains(const ChunkKey& key) {
  const std::string k = RedisKey(key);
  absl::StatusOr<RedisReply> reply =
      cluster_->Run({k, {"EXISTS", k}}, absl::Now() + options_.command_timeout);
  return reply.ok() && reply->type == RedisReply::Type::kInteger && reply->integer == 1;
}

absl::Status RedisStore::Put(const ChunkKey& key, absl::string_view value,
                             std::vector<EvictedChunk>* /*evicted: Redis evicts itself*/) {
  const std::string k = RedisKey(key);
  // One round trip for a new chunk: SET ... NX stores it unless the key is there.
  const bool ttl = options_.ttl > absl::ZeroDuration();
  RedisArgv set = {"SET", k, std::string(value), "NX"};
  if (ttl) {
    set.push_back("PX");
    set.push_back(TtlMillis());
  }
  KVARENA_ASSIGN_OR_RETURN(
      RedisReply reply, cluster_->Run({k, std::move(set)}, absl::Now() + options_.command_timeout));
  if (reply.type == RedisReply::Type::kNil) {
    // Content-addressed: the same key holds the same chunk. A ttl is renewed, as a Get
    // renews it.
    already_present_.fetch_add(1, std::memory_order_relaxed);
    if (ttl) {
      KVARENA_ASSIGN_OR_RETURN(
          RedisReply renewed,
          cluster_->Run({k, {"PEXPIRE", k, TtlMillis()}}, absl::Now() + options_.command_timeout));
      if (renewed.type != RedisReply::Type::kInteger)
        return Unexpected(*cluster_, "PEXPIRE", k, renewed);
    }
  } else if (reply.type != RedisReply::Type::kStatus || reply.str != "OK") {
    return Unexpected(*cluster_, "SET", k, reply);
  }
  Remember(key, value.size());
  return absl::OkStatus();
}

void RedisStore::Erase(const ChunkKey& key) {
  const std::string k = RedisKey(key);
  (void)cluster_->Run({k, {"DEL", k}}, absl::Now() + options_.command_timeout);
  Forget(key);
}

TierUsage RedisStore::Usage() const {
  TierUsage usage;
  usage.up = cluster_->up();
  absl::MutexLock lock(&mu_);
  ForgetExpiredLocked(options_.clock->Now());
  usage.bytes_used = bytes_;
  usage.chunks = int64_t(sizes_.size());
  return usage;
}

absl::StatusOr<std::unique_ptr<TierStore>> NewRedisStore(const RedisStoreOptions& options) {
  KVARENA_ASSIGN_OR_RETURN(std::unique_ptr<RedisStore> store, RedisStore::Create(options));
  return std::unique_ptr<TierStore>(std::move(store));
}

}  // namespace kvarena
