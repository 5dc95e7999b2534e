// Test-only: real redis-server processes for the Redis tier's tests. RedisTestCluster
// starts redis-server on free loopback ports in a fresh temp dir — one plain server, or
// primaries (+ replicas) made into a Redis Cluster with `redis-cli --cluster create` and
// waited for until CLUSTER INFO says cluster_state:ok on every node — and SIGKILLs every
// process when destroyed (a test that fails leaves none behind; the children also get
// SIGKILL if the test process dies, tests/mp/subprocess.h).
//
// Thread-compatible: one test thread drives it.
#ifndef KVARENA_TESTS_REDIS_REDIS_HARNESS_H_
#define KVARENA_TESTS_REDIS_REDIS_HARNESS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/mp/subprocess.h"
#include "tests/support/temp_dir.h"

namespace kvarena::testing {

// The path of `name` on $PATH (or /usr/bin, /usr/sbin), "" when missing.
std::string FindProgram(const std::string& name);
// Whether redis-server and redis-cli are installed (the tests GTEST_SKIP otherwise).
bool RedisInstalled();
// A loopback port that nothing listens on, nor on port + 10000 (the cluster bus).
int PickRedisPort();

struct RedisTestClusterOptions {
  bool cluster = true;  // false: one plain redis-server (primaries must be 1, replicas 0)
  int primaries = 3;
  int replicas = 1;                      // per primary
  std::vector<int> ports;                // empty: picked; else primaries * (1 + replicas)
  std::vector<std::string> server_args;  // extra redis-server arguments ("--requirepass", "x")
  std::string cli_password;              // what redis-cli AUTHs with ("" none)
};

// One plain (non-cluster) redis-server; primaries (each with `replicas`) as a cluster.
RedisTestClusterOptions PlainRedis();
RedisTestClusterOptions ClusterOf(int primaries, int replicas);

class RedisTestCluster {
 public:
  static absl::StatusOr<std::unique_ptr<RedisTestCluster>> Start(
      const RedisTestClusterOptions& options);
  ~RedisTestCluster();
  RedisTestCluster(const RedisTestCluster&) = delete;
  RedisTestCluster& operator=(const RedisTestCluster&) = delete;

  // "127.0.0.1:p1,127.0.0.1:p2,..." (every node).
  std::string Seeds() const;
  const std::vector<int>& ports() const { return ports_; }
  // Runs redis-cli against the node on `port`; its stdout+stderr, or an error naming the
  // command when it exits non-zero or runs past 20 s.
  absl::StatusOr<std::string> Cli(int port, const std::vector<std::string>& args) const;
  // The node's CLUSTER MYID.
  absl::StatusOr<std::string> NodeId(int port) const;
  // The ports of the primaries, and of the replica of the primary on `port`.
  absl::StatusOr<std::vector<int>> Primaries() const;
  absl::StatusOr<int> ReplicaOf(int primary_port) const;
  // Polls until every live node's CLUSTER INFO says cluster_state:ok.
  absl::Status WaitClusterOk(absl::Duration timeout) const;
  // Polls until the primary on `port` lists a replica and that replica holds as many keys.
  absl::Status WaitReplicated(int primary_port, absl::Duration timeout) const;
  // Polls until every live node's CLUSTER NODES names the node on `port` a primary owning
  // slots (a replica promoted after its primary failed, as the whole cluster sees it).
  absl::Status WaitPrimary(int port, absl::Duration timeout) const;
  // Sends sig to the node on `port` (SIGKILL: it is then left out of the waits).
  void Signal(int port, int sig);

 private:
  RedisTestCluster() = default;
  absl::Status StartServer(int port, const RedisTestClusterOptions& options);
  absl::StatusOr<std::vector<std::vector<std::string>>> ClusterNodes(int port) const;

  TempDir dir_;  // a directory per server under it
  std::vector<int> ports_;
  std::vector<std::unique_ptr<Subprocess>> servers_;  // by ports_ index
  std::vector<bool> killed_;
  std::string cli_password_;
};

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_REDIS_REDIS_HARNESS_H_
