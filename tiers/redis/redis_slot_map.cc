// RedisCluster's slot map: loading it (CLUSTER SLOTS, or one non-cluster node owning every
// slot), the background refresher, and what the map says about the cluster's health.
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "tiers/redis/redis_cluster.h"

namespace kvarena {
namespace {

bool IsInteger(const RedisReply& r) { return r.type == RedisReply::Type::kInteger; }

}  // namespace

absl::StatusOr<std::shared_ptr<const RedisCluster::SlotMap>> RedisCluster::LoadMapFrom(
    const RedisAddress& address) {
  const absl::Time deadline =
      absl::Now() + options_.connect.connect_timeout + options_.connect.command_timeout;
  KVARENA_ASSIGN_OR_RETURN(const std::vector<RedisReply> replies,
                           Node(address)->Run({{"CLUSTER", "SLOTS"}}, deadline));
  const RedisReply& reply = replies[0];
  const std::string from = absl::StrCat("redis node ", address.ToString(), ": CLUSTER SLOTS: ");
  auto map = std::make_shared<SlotMap>();
  map->owner.fill(-1);
  if (reply.type == RedisReply::Type::kError) {
    if (!absl::StrContains(reply.str, "cluster support disabled")) {
      return absl::UnavailableError(absl::StrCat(from, reply.str));
    }
    map->cluster = false;  // a single Redis: it owns every slot
    map->nodes.push_back(address);
    map->owner.fill(0);
    return map;
  }
  if (reply.type != RedisReply::Type::kArray || reply.elements.empty()) {
    return absl::UnavailableError(absl::StrCat(from, "no slot ranges (cluster not formed yet)"));
  }
  for (const RedisReply& range : reply.elements) {
    // [start, end, [host, port, id...], replicas...]
    if (range.type != RedisReply::Type::kArray || range.elements.size() < 3 ||
        !IsInteger(range.elements[0]) || !IsInteger(range.elements[1]) ||
        range.elements[2].type != RedisReply::Type::kArray ||
        range.elements[2].elements.size() < 2 ||
        range.elements[2].elements[0].type != RedisReply::Type::kString ||
        !IsInteger(range.elements[2].elements[1])) {
      return absl::InternalError(absl::StrCat(from, "malformed slot range"));
    }
    const int64_t start = range.elements[0].integer, end = range.elements[1].integer;
    const int64_t port = range.elements[2].elements[1].integer;
    std::string host = range.elements[2].elements[0].str;
    if (host.empty() || host == "?") host = address.host;  // endpoint unknown: the one asked
    if (start < 0 || end < start || end >= kRedisSlots || port < 1 || port > 65535 ||
        map->nodes.size() >= size_t(INT16_MAX)) {
      return absl::InternalError(absl::StrCat(from, "slot range [", start, ", ", end, "] on port ",
                                              port, " out of bounds"));
    }
    const RedisAddress owner{host, int(port)};
    int16_t index = -1;
    for (size_t i = 0; i < map->nodes.size(); ++i) {
      if (map->nodes[i].ToString() == owner.ToString()) index = int16_t(i);
    }
    if (index < 0) {
      index = int16_t(map->nodes.size());
      map->nodes.push_back(owner);
    }
    for (int64_t s = start; s <= end; ++s) map->owner[s] = index;
  }
  return map;
}

bool RedisCluster::Refresh() {
  // The nodes of the current map, healthy ones first, then the seeds.
  std::vector<RedisAddress> candidates;
  if (std::shared_ptr<const SlotMap> map = Map()) {
    for (const RedisAddress& a : map->nodes) {
      if (Node(a)->healthy())
        candidates.insert(candidates.begin(), a);
      else
        candidates.push_back(a);
    }
  }
  candidates.insert(candidates.end(), options_.seeds.begin(), options_.seeds.end());
  for (const RedisAddress& address : candidates) {
    if (Node(address)->BreakerOpen(options_.connect.clock->Now())) continue;
    absl::StatusOr<std::shared_ptr<const SlotMap>> map = LoadMapFrom(address);
    if (!map.ok()) {
      NoteError(map.status());
      continue;
    }
    RedisCounters::Add(counters_.slot_refreshes);
    absl::MutexLock lock(&mu_);
    map_ = *std::move(map);
    return true;
  }
  return false;
}

// The pacing is a timed wait of this thread, on the system clock: a FakeClock cannot wake
// it, and the interval bounds the load put on a real cluster. What it decides by the
// breaker (Refresh skips a node behind an open one) reads options_.connect.clock.
void RedisCluster::RefreshLoop() {
  for (;;) {
    bool want = false;
    int64_t started = 0;
    {
      absl::MutexLock lock(&mu_);
      const auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || refresh_requested_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&woken), options_.refresh_interval);
      if (stop_) return;
      want = refresh_requested_ || map_ == nullptr;
      refresh_requested_ = false;
      for (size_t i = 0; !want && i < map_->nodes.size(); ++i) {
        auto it = nodes_.find(map_->nodes[i].ToString());
        want = it != nodes_.end() && !it->second->healthy();
      }
      if (want) started = ++refreshes_started_;
    }
    const bool loaded = want && Refresh();
    absl::MutexLock lock(&mu_);
    if (want) {
      refreshes_finished_ = started;
      if (!loaded) refresh_requested_ = true;  // tried again after the interval
    }
    // At most one refresh per interval.
    mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.refresh_interval);
    if (stop_) return;
  }
}

bool RedisCluster::up() const {
  const absl::Time now = options_.connect.clock->Now();
  absl::MutexLock lock(&mu_);
  if (map_ == nullptr) return false;
  for (const RedisAddress& a : map_->nodes) {
    auto it = nodes_.find(a.ToString());
    if (it == nodes_.end() || !it->second->BreakerOpen(now)) return true;
  }
  return false;
}

bool RedisCluster::cluster_mode() const {
  absl::MutexLock lock(&mu_);
  return map_ == nullptr || map_->cluster;
}

std::string RedisCluster::TEST_NodeForKey(absl::string_view key) const {
  absl::MutexLock lock(&mu_);
  if (map_ == nullptr) return "";
  const int owner = map_->owner[RedisKeySlot(key)];
  return owner < 0 ? "" : map_->nodes[owner].ToString();
}

bool RedisCluster::TEST_BreakerOpen(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(address);
  return it != nodes_.end() && it->second->BreakerOpen(options_.connect.clock->Now());
}

}  // namespace kvarena
