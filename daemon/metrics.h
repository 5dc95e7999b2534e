// The Prometheus endpoint of kvarenad (--metrics_address, --metrics_port): GET /metrics reads
// KvStore::Stats() at scrape time (counters only, O(1) in caches and pages) plus the RPC
// counters, so nothing is sampled in the background.
//
// Thread-safety: scrapes run on the exposer's threads and only read thread-safe state.
#ifndef KVARENA_DAEMON_METRICS_H_
#define KVARENA_DAEMON_METRICS_H_

#include <memory>
#include <string>
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
  // Serves http://address:port/metrics (an IPv6 address is bracketed for it). store and
  // rpcs must outlive the server. UNAVAILABLE naming both flags when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              int port, const KvStore* store,
                                                              const RpcCounters* rpcs);
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
