#include "tiers/redis/redis_cluster.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvarena {
namespace {

// An error reply as a status naming the node.
absl::Status ErrorReplyStatus(const RedisAddress& node, absl::string_view error) {
  const std::string message = absl::StrCat("redis node ", node.ToString(), ": ", error);
  if (absl::StartsWith(error, "NOAUTH") || absl::StartsWith(error, "WRONGPASS")) {
    return absl::UnauthenticatedError(message);
  }
  if (absl::StartsWith(error, "NOPERM")) return absl::PermissionDeniedError(message);
  if (absl::StartsWith(error, "OOM")) return absl::ResourceExhaustedError(message);
  // The key holds a value of another type: what it holds is no chunk.
  if (absl::StartsWith(error, "WRONGTYPE")) return absl::DataLossError(message);
  return absl::InternalError(message);
}

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 :6381" (an empty host: the replying node's).
struct Redirect {
  bool moved = false;
  int slot = 0;
  RedisAddress to;
};
std::optional<Redirect> ParseRedirect(absl::string_view error, const RedisAddress& from) {
  const std::vector<absl::string_view> parts = absl::StrSplit(error, ' ');
  if (parts.size() != 3 || (parts[0] != "MOVED" && parts[0] != "ASK")) return std::nullopt;
  Redirect r;
  r.moved = parts[0] == "MOVED";
  if (!absl::SimpleAtoi(parts[1], &r.slot) || r.slot < 0 || r.slot >= kRedisSlots) {
    return std::nullopt;
  }
  const std::string target =
      absl::StartsWith(parts[2], ":") ? absl::StrCat(from.host, parts[2]) : std::string(parts[2]);
  absl::StatusOr<RedisAddress> to = ParseRedisAddress(target, "redirect");
  if (!to.ok()) return std::nullopt;
  r.to = *std::move(to);
  return r;
}

bool IsRetryLater(absl::string_view error) {
  return absl::StartsWith(error, "TRYAGAIN") || absl::StartsWith(error, "CLUSTERDOWN") ||
         absl::StartsWith(error, "LOADING");
}

}  // namespace

struct RedisCluster::Pending {
  size_t index = 0;  // into the commands
  int slot = 0;
  std::optional<RedisAddress> ask;  // ASK target: send ASKING first
  int redirects = 0;
};

RedisCluster::RedisCluster(RedisClusterOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<RedisCluster>> RedisCluster::Create(RedisClusterOptions options) {
  if (options.seeds.empty()) {
    return absl::InvalidArgumentError("redis seeds: at least one HOST:PORT is needed");
  }
  if (options.max_redirects < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("redis max_redirects=", options.max_redirects, ": must be at least 1"));
  }
  if (options.connect.clock == nullptr) {
    return absl::InvalidArgumentError("redis clock: null (RealClock() is the system's)");
  }
  std::unique_ptr<RedisCluster> cluster(new RedisCluster(std::move(options)));
  cluster->Refresh();
  cluster->refresher_ = std::thread([c = cluster.get()] { c->RefreshLoop(); });
  return cluster;
}

RedisCluster::~RedisCluster() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (refresher_.joinable()) refresher_.join();
}

std::shared_ptr<RedisNode> RedisCluster::Node(const RedisAddress& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<RedisNode>& node = nodes_[address.ToString()];
  if (node == nullptr) node = std::make_shared<RedisNode>(address, options_.connect, &counters_);
  return node;
}

std::shared_ptr<const RedisCluster::SlotMap> RedisCluster::Map() const {
  absl::MutexLock lock(&mu_);
  return map_;
}

void RedisCluster::NoteError(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  last_error_ = std::string(status.message());
}

std::string RedisCluster::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

void RedisCluster::RequestRefresh() {
  absl::MutexLock lock(&mu_);
  refresh_requested_ = true;
}

void RedisCluster::AwaitRefresh(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  refresh_requested_ = true;
  const int64_t next = refreshes_started_ + 1;
  const auto done = [this, next]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || refreshes_finished_ >= next;
  };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
}

void RedisCluster::ApplyMoved(int slot, const RedisAddress& owner) {
  absl::MutexLock lock(&mu_);
  if (map_ == nullptr) return;
  auto map = std::make_shared<SlotMap>(*map_);
  const std::string name = owner.ToString();
  auto it = std::find_if(map->nodes.begin(), map->nodes.end(),
                         [&](const RedisAddress& a) { return a.ToString() == name; });
  if (it == map->nodes.end()) {
    if (map->nodes.size() >= size_t(INT16_MAX)) return;
    it = map->nodes.insert(map->nodes.end(), owner);
  }
  map->owner[slot] = int16_t(it - map->nodes.begin());
  map_ = std::move(map);
}

std::vector<absl::StatusOr<RedisReply>> RedisCluster::Run(const std::vector<RedisCommand>& commands,
                                                          absl::Time deadline) {
  std::vector<absl::StatusOr<RedisReply>> results(commands.size(),
                                                  absl::UnavailableError("redis: command not run"));
  std::vector<Pending> pending(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    pending[i].index = i;
    pending[i].slot = RedisKeySlot(commands[i].key);
  }
  absl::Duration backoff = absl::Milliseconds(5);
  while (!pending.empty()) {
    std::shared_ptr<const SlotMap> map = Map();
    absl::Status stop;
    if (absl::Now() >= deadline) {
      stop = absl::DeadlineExceededError("redis: deadline passed while redirected or backing off");
    } else if (map == nullptr) {
      RequestRefresh();
      stop = absl::UnavailableError(absl::StrCat(
          "redis: no slot map (the cluster has not answered yet); last error: ", last_error()));
    }
    if (!stop.ok()) {
      for (const Pending& p : pending) results[p.index] = stop;
      break;
    }
    // One batch per node, in the order first asked.
    std::vector<std::pair<RedisAddress, std::vector<Pending>>> batches;
    absl::flat_hash_map<std::string, size_t> batch_of;
    for (Pending& p : pending) {
      const int owner = map->owner[p.slot];
      if (!p.ask.has_value() && owner < 0) {
        RequestRefresh();
        results[p.index] = absl::UnavailableError(
            absl::StrCat("redis: slot ", p.slot, " has no owner in the slot map"));
        continue;
      }
      const RedisAddress& to = p.ask.has_value() ? *p.ask : map->nodes[owner];
      auto [it, added] = batch_of.try_emplace(to.ToString(), batches.size());
      if (added) batches.emplace_back(to, std::vector<Pending>{});
      batches[it->second].second.push_back(std::move(p));
    }
    std::vector<Pending> next;
    bool back_off = false;
    for (auto& [address, batch] : batches) {
      RunOnNode(address, batch, commands, deadline, results, next, back_off);
    }
    pending = std::move(next);
    if (back_off && !pending.empty()) {
      absl::SleepFor(std::min(backoff, deadline - absl::Now()));
      backoff = std::min(backoff * 2, absl::Milliseconds(100));
    }
  }
  return results;
}

absl::StatusOr<RedisReply> RedisCluster::Run(const RedisCommand& command, absl::Time deadline) {
  return std::move(Run(std::vector<RedisCommand>{command}, deadline)[0]);
}

void RedisCluster::RunOnNode(const RedisAddress& address, std::vector<Pending>& batch,
                             const std::vector<RedisCommand>& commands, absl::Time deadline,
                             std::vector<absl::StatusOr<RedisReply>>& results,
                             std::vector<Pending>& next, bool& back_off) {
  std::vector<RedisArgv> argvs;
  for (const Pending& p : batch) {
    if (p.ask.has_value()) argvs.push_back({"ASKING"});
    argvs.push_back(commands[p.index].argv);
  }
  std::shared_ptr<RedisNode> node = Node(address);
  // Behind an open breaker, Run refuses at once.
  const bool breaker_open = node->BreakerOpen(options_.connect.clock->Now());
  absl::StatusOr<std::vector<RedisReply>> replies = node->Run(argvs, deadline);
  if (!replies.ok()) {
    NoteError(replies.status());
    // The node may be gone and its slots taken over by a replica. One that failed just now
    // waits for the map to be reloaded; one behind an open breaker does not wait (the map is
    // reloaded every interval while a node of it is unhealthy).
    if (breaker_open) {
      RequestRefresh();
    } else {
      AwaitRefresh(deadline);
    }
    const std::shared_ptr<const SlotMap> map = Map();
    for (Pending& p : batch) {
      const int owner = map == nullptr ? -1 : map->owner[p.slot];
      if (owner >= 0 && map->nodes[owner].ToString() != address.ToString() &&
          ++p.redirects <= options_.max_redirects) {
        p.ask.reset();  // to the slot's owner now
        next.push_back(std::move(p));
      } else {
        results[p.index] = replies.status();
      }
    }
    return;
  }
  size_t r = 0;
  for (Pending& p : batch) {
    if (p.ask.has_value() && (*replies)[r++].type == RedisReply::Type::kError) {
      results[p.index] = ErrorReplyStatus(address, (*replies)[r - 1].str);
      ++r;
      continue;
    }
    RedisReply& reply = (*replies)[r++];
    if (reply.type != RedisReply::Type::kError) {
      results[p.index] = std::move(reply);
      continue;
    }
    if (std::optional<Redirect> redirect = ParseRedirect(reply.str, address)) {
      if (++p.redirects > options_.max_redirects) {
        results[p.index] = absl::UnavailableError(
            absl::StrCat("redis: more than ", options_.max_redirects,
                         " redirects for one command; the last: ", reply.str));
        NoteError(results[p.index].status());
        continue;
      }
      if (redirect->moved) {
        RedisCounters::Add(counters_.moved);
        ApplyMoved(redirect->slot, redirect->to);
        RequestRefresh();
        p.ask.reset();
      } else {
        RedisCounters::Add(counters_.ask);
        p.ask = redirect->to;
      }
      next.push_back(std::move(p));
    } else if (IsRetryLater(reply.str)) {
      RedisCounters::Add(counters_.retries);
      back_off = true;
      p.ask.reset();
      next.push_back(std::move(p));
    } else {
      RedisCounters::Add(counters_.errors);
      results[p.index] = ErrorReplyStatus(address, reply.str);
      NoteError(results[p.index].status());
    }
  }
}

}  // namespace kvarena
