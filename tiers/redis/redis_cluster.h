// RedisCluster: kvarena's own thin Redis Cluster client over hiredis 0.14 (which has no
// cluster support). It keeps the slot map (CLUSTER SLOTS, loaded from the seed nodes at
// start and again in the background, at most once per refresh_interval: after a MOVED, a
// failed command, a failed refresh, and while there is no map or a node of it is
// unhealthy; asked of the map's healthy nodes first, then the seeds, never of a node behind
// an open breaker); a single non-cluster Redis ("cluster support disabled") is one node
// owning every slot. A command goes to the node owning its key's slot (CRC16 with hash
// tags, redis_slot.h); commands asked at once are pipelined per node. MOVED is followed
// (the slot's owner updated at once), ASK answered with ASKING on the named node,
// TRYAGAIN / CLUSTERDOWN / LOADING backed off (5 ms doubling to 100 ms) and retried until
// the deadline; MOVED and ASK together at most max_redirects times per command. Each node
// has a circuit breaker (redis_node.h): a dead or hung node costs one timeout per breaker
// period, its keys fail at once in between. A failover is learned without a MOVED: when a
// node fails a command, the command waits (until its deadline) for the next refresh, and
// is sent again when the reloaded map names another owner of its slot (a replica that
// took over); one refused by an open breaker goes to the owner the map names now. So a
// command may reach Redis twice: commands must be safe to repeat (RedisStore's are).
//
// Thread-safety: safe for concurrent use. mu_ guards the slot map and the node table and is
// never held across a network call; a background thread does the refreshes.
#ifndef KVARENA_TIERS_REDIS_REDIS_CLUSTER_H_
#define KVARENA_TIERS_REDIS_REDIS_CLUSTER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tiers/redis/redis_node.h"
#include "tiers/redis/redis_reply.h"
#include "tiers/redis/redis_slot.h"

namespace kvarena {

struct RedisClusterOptions {
  std::vector<RedisAddress> seeds;  // at least one
  RedisConnectOptions connect;
  // The least between refreshes, in real time (a wait of the refresher thread); the
  // breakers read connect.clock.
  absl::Duration refresh_interval = absl::Milliseconds(200);
  int max_redirects = 5;
};

// One command for the node owning `key`'s slot (argv names the key too).
struct RedisCommand {
  std::string key;
  RedisArgv argv;
};

class RedisCluster {
 public:
  // INVALID_ARGUMENT without seeds or without a clock. Asks the seeds for a slot map before
  // it returns (each seed once, bounded by the connect and command timeouts). An unreachable
  // cluster is not an error: the client starts without a slot map (up() false, commands
  // UNAVAILABLE) and the background refresher loads one when the cluster answers.
  static absl::StatusOr<std::unique_ptr<RedisCluster>> Create(RedisClusterOptions options);
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  // Runs the commands, pipelined per node, and returns one result per command, in order:
  // the reply (never an error reply: those become statuses — UNAUTHENTICATED for NOAUTH /
  // WRONGPASS, PERMISSION_DENIED for NOPERM, RESOURCE_EXHAUSTED for OOM, INTERNAL else),
  // or UNAVAILABLE / DEADLINE_EXCEEDED when the node could not be asked in time.
  std::vector<absl::StatusOr<RedisReply>> Run(const std::vector<RedisCommand>& commands,
                                              absl::Time deadline);
  absl::StatusOr<RedisReply> Run(const RedisCommand& command, absl::Time deadline);

  // A slot map is loaded and some node owning slots is not behind an open breaker.
  bool up() const;
  // False when the map came from a non-cluster Redis.
  bool cluster_mode() const;
  RedisCounterValues counters() const { return counters_.Values(); }
  // The most recent failure's message ("" when none yet); NoteError records one seen by a
  // caller (a reply of the wrong type).
  std::string last_error() const;
  void NoteError(const absl::Status& status);
  // Test hooks: the node the map names for key ("" without a map), and its breaker.
  std::string TEST_NodeForKey(absl::string_view key) const;
  bool TEST_BreakerOpen(const std::string& address) const;

 private:
  struct SlotMap {
    std::vector<RedisAddress> nodes;
    std::array<int16_t, kRedisSlots> owner;  // index into nodes, -1: no owner
    bool cluster = true;
  };
  struct Pending;

  explicit RedisCluster(RedisClusterOptions options);
  std::shared_ptr<RedisNode> Node(const RedisAddress& address);
  std::shared_ptr<const SlotMap> Map() const;
  bool Refresh();  // loads a slot map from the first node that gives one; false if none
  absl::StatusOr<std::shared_ptr<const SlotMap>> LoadMapFrom(const RedisAddress& address);
  void ApplyMoved(int slot, const RedisAddress& owner);
  void RequestRefresh();
  // Requests a refresh and waits until one begun after this call has finished (loaded a
  // map or not), the deadline passes, or the client stops.
  void AwaitRefresh(absl::Time deadline);
  void RefreshLoop();
  // Sends one node's share of the pending commands; fills `results` or re-queues in `next`.
  void RunOnNode(const RedisAddress& address, std::vector<Pending>& batch,
                 const std::vector<RedisCommand>& commands, absl::Time deadline,
                 std::vector<absl::StatusOr<RedisReply>>& results, std::vector<Pending>& next,
                 bool& back_off);

  const RedisClusterOptions options_;
  RedisCounters counters_;

  mutable absl::Mutex mu_;
  std::shared_ptr<const SlotMap> map_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<RedisNode>> nodes_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  bool refresh_requested_ ABSL_GUARDED_BY(mu_) = false;
  int64_t refreshes_started_ ABSL_GUARDED_BY(mu_) = 0;   // numbered by the refresher
  int64_t refreshes_finished_ ABSL_GUARDED_BY(mu_) = 0;  // the latest that finished
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread refresher_;
};

}  // namespace kvarena

#endif  // KVARENA_TIERS_REDIS_REDIS_CLUSTER_H_
