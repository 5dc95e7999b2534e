// The Prometheus endpoint of kvarenad (--metrics_address, --metrics_port): GET /metrics
// reads KvStore::Stats() (counters only, O(1) in caches and pages), the RPC metrics and
// the fd socket's at scrape time, so nothing is sampled in the background.
// docs/metrics.md lists every family. Label values come from fixed sets (method, code, reason,
// op, backend) or from a pool's geometry — never from a cache, session or pool id — so
// the number of series stays bounded however many caches and sessions come and go.
// prometheus-cpp writes the text exposition format (0.0.4).
//
// Thread-safety: scrapes run on the exposer's threads and only read thread-safe state.
#ifndef KVARENA_DAEMON_METRICS_H_
#define KVARENA_DAEMON_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/kv_store.h"
#include "daemon/fd_metrics.h"
#include "daemon/rpc_metrics.h"
#include "daemon/tier_metrics.h"
#include "tiers/redis/redis_store.h"

namespace prometheus {
class Collectable;
class Exposer;
struct MetricFamily;
}  // namespace prometheus

namespace kvarena {

// What a scrape reads; every pointer must outlive whoever holds the sources.
struct MetricSources {
  const KvStore* store = nullptr;
  const RpcMetrics* rpcs = nullptr;
  const FdMetrics* fd = nullptr;
  const TierLatency* tiers = nullptr;  // may be null: no tier latency histograms
  const RedisStore* redis = nullptr;   // the cluster tier, if any: its client's counters
};

// Every family a scrape returns: kvarena_pages_used, kvarena_pool_pages_used{dtype,...},
// kvarena_rpc_total{method,code}, kvarena_rpc_duration_seconds{method,code}, ...
// A labelled family has a sample only for the label values seen (non-zero counts).
std::vector<prometheus::MetricFamily> CollectMetrics(const MetricSources& sources);

class MetricsServer {
 public:
  // Serves http://address:port/metrics (an IPv6 address is bracketed for it).
  // UNAVAILABLE naming both flags when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address, int port,
                                                              MetricSources sources);
  // "127.0.0.1:9464", "[::1]:9464": where it listens.
  const std::string& bind_address() const { return bind_address_; }
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

 private:
  explicit MetricsServer(std::string bind_address);
  const std::string bind_address_;
  std::shared_ptr<prometheus::Collectable> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_METRICS_H_
