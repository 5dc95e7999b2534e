// RedisServers: redis-server processes a benchmark starts on free loopback ports — one plain
// server, or three primaries and three replicas made into a Redis Cluster with `redis-cli
// --cluster create` (as bench/redis_tier.sh does) — each SIGKILLed by the destructor, and
// with the bench if it dies (ChildProcess: construct on the main thread). Header-only;
// thread-compatible.
#ifndef KVARENA_BENCH_REDIS_SERVERS_H_
#define KVARENA_BENCH_REDIS_SERVERS_H_

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bench/child_daemon.h"
#include "bench/loopback.h"

namespace kvarena {

class RedisServers {
 public:
  // `server` and `cli`: the redis-server and redis-cli programs; logs and data under `dir`.
  static absl::StatusOr<std::unique_ptr<RedisServers>> Start(const std::string& server,
                                                             const std::string& cli,
                                                             const std::string& dir, bool cluster) {
    std::unique_ptr<RedisServers> r(new RedisServers(cluster));
    for (int i = 0; i < (cluster ? 6 : 1); ++i) {
      int port = FreePort();
      for (int tries = 0; cluster && !(port > 0 && port < 55000 && PortFree(port + 10000));
           ++tries) {
        if (tries == 100) return absl::UnavailableError("no free port pair for a cluster node");
        port = FreePort();  // the cluster bus listens on port + 10000
      }
      std::vector<std::string> argv = {server,
                                       "--port",
                                       std::to_string(port),
                                       "--bind",
                                       "127.0.0.1",
                                       "--dir",
                                       dir,
                                       "--save",
                                       "",
                                       "--appendonly",
                                       "no",
                                       "--maxmemory",
                                       "2gb",
                                       "--maxmemory-policy",
                                       "allkeys-lru"};
      if (cluster) {
        argv.insert(argv.end(), {"--cluster-enabled", "yes", "--cluster-config-file",
                                 absl::StrCat("nodes-", port, ".conf"), "--cluster-node-timeout",
                                 "5000", "--cluster-require-full-coverage", "no"});
      }
      r->servers_.push_back(std::make_unique<ChildProcess>(
          argv, absl::StrCat(dir, "/redis-", port, ".log"), SIGKILL));
      r->ports_.push_back(port);
    }
    for (int port : r->ports_) KVARENA_RETURN_IF_ERROR(WaitListening(port, "redis-server"));
    if (!cluster) return r;
    std::string create = cli + " --cluster create";
    for (int port : r->ports_) absl::StrAppend(&create, " 127.0.0.1:", port);
    CommandOutput(create + " --cluster-replicas 1 --cluster-yes 2>&1");
    for (int port : r->ports_) {
      for (int i = 0;; ++i) {
        if (CommandOutput(absl::StrCat(cli, " -p ", port, " cluster info"))
                .find("cluster_state:ok") != std::string::npos) {
          break;
        }
        if (i == 300)
          return absl::UnavailableError(
              absl::StrCat("cluster node ", port, " never reached state ok"));
        usleep(100'000);
      }
    }
    return r;
  }
  RedisServers(const RedisServers&) = delete;
  RedisServers& operator=(const RedisServers&) = delete;

  // --tier_redis's value: the primaries (the first three a cluster create makes primaries).
  std::string Seeds() const {
    std::string seeds;
    for (size_t i = 0; i < ports_.size() && i < 3; ++i)
      absl::StrAppend(&seeds, i ? "," : "", "127.0.0.1:", ports_[i]);
    return seeds;
  }

  // redis-benchmark's GET of `bytes`-byte values, one client, no pipeline, in GB/s (SET runs
  // first: a GET of a key never set reads a nil); 0 when it did not run.
  double CeilingGbps(const std::string& benchmark, int64_t bytes, int requests) const {
    const std::string out = CommandOutput(absl::StrCat(
        benchmark, cluster_ ? " --cluster" : "", " -p ", ports_[0], " -t set,get -d ", bytes,
        " -n ", requests, " -c 1 -q 2>/dev/null | tr '\\r' '\\n' | grep '^GET: [0-9]' | tail -1"));
    double rps = 0;
    if (std::sscanf(out.c_str(), "GET: %lf", &rps) != 1) return 0;
    return rps * double(bytes) / 1e9;
  }

 private:
  explicit RedisServers(bool cluster) : cluster_(cluster) {}

  bool cluster_;
  std::vector<int> ports_;
  std::vector<std::unique_ptr<ChildProcess>> servers_;
};

}  // namespace kvarena

#endif  // KVARENA_BENCH_REDIS_SERVERS_H_
