// RedisReply: a reply of the Redis protocol copied out of hiredis, so nothing outside
// redis_node.cc sees a hiredis type; and RedisCounters, what the cluster client counts.
//
// Value types; RedisCounters is safe for concurrent use (relaxed atomics).
#ifndef KVARENA_TIERS_REDIS_REDIS_REPLY_H_
#define KVARENA_TIERS_REDIS_REDIS_REPLY_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace kvarena {

struct RedisReply {
  enum class Type { kNil, kString, kStatus, kError, kInteger, kArray };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus, kError
  int64_t integer = 0;
  std::vector<RedisReply> elements;  // kArray
};

// A command: argv[0] is its name; binary-safe arguments.
using RedisArgv = std::vector<std::string>;

// What the cluster client has seen since it started.
struct RedisCounterValues {
  int64_t moved = 0;           // MOVED redirects followed
  int64_t ask = 0;             // ASK redirects answered with ASKING
  int64_t retries = 0;         // TRYAGAIN, CLUSTERDOWN and LOADING replies backed off
  int64_t errors = 0;          // error replies and transport failures (timeouts included)
  int64_t timeouts = 0;        // connects, reads or writes that ran out of time
  int64_t breaker_opens = 0;   // a node's circuit breaker opened (or reopened after a probe)
  int64_t breaker_skips = 0;   // commands not sent because their node's breaker was open
  int64_t slot_refreshes = 0;  // slot maps loaded (CLUSTER SLOTS, or one node owning all)
};

struct RedisCounters {
  std::atomic<int64_t> moved{0}, ask{0}, retries{0}, errors{0}, timeouts{0}, breaker_opens{0},
      breaker_skips{0}, slot_refreshes{0};

  static void Add(std::atomic<int64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }
  RedisCounterValues Values() const {
    auto v = [](const std::atomic<int64_t>& c) { return c.load(std::memory_order_relaxed); };
    return {v(moved),    v(ask),           v(retries),       v(errors),
            v(timeouts), v(breaker_opens), v(breaker_skips), v(slot_refreshes)};
  }
};

}  // namespace kvarena

#endif  // KVARENA_TIERS_REDIS_REDIS_REPLY_H_
