// The Prometheus endpoint of kvarenad (--metrics_port): GET /metrics reads
// KvStore::Stats() at scrape time (counters only, O(1) in caches and pages) plus the RPC
// counters, so nothing is sampled in the background.
//
// Thread-safety: scrapes run on the exposer's threads and only read thread-safe state.
#ifndef KVARENA_DAEMON_METRICS_H_
#define KVARENA_DAEMON_METRICS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/kv_store.h"
#include "daemon/rpc_counters.h"

namespace prometheus {
class Collectable;
class Exposer;
struct MetricFamily;
}  // namespace prometheus

namespace kvarena {

// Every family a scrape returns: kvarena_pages_used, kvarena_pool_pages_used{pool_id,...},
// kvarena_rpc_total{method,code}, ...
std::vector<prometheus::MetricFamily> CollectMetrics(const KvStore& store,
                                                     const RpcCounters& rpcs);

class MetricsServer {
 public:
  // Serves 0.0.0.0:port/metrics. store and rpcs must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(int port, const KvStore* store,
                                                              const RpcCounters* rpcs);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

 private:
  MetricsServer() = default;
  std::shared_ptr<prometheus::Collectable> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_METRICS_H_
