// The tiers' families of kvarenad's /metrics (docs/tiers.md, docs/metrics.md), one sample
// per medium ("host", "disk", "redis"):
//   kvarena_tier_bytes_used, kvarena_tier_bytes_limit, kvarena_tier_chunks, kvarena_tier_up
//   (gauges); kvarena_tier_lookups_total, kvarena_tier_hit_chunks_total,
//   kvarena_tier_miss_chunks_total, kvarena_tier_loaded_tokens_total,
//   kvarena_tier_stored_chunks_total, kvarena_tier_dropped_writes_total,
//   kvarena_tier_corrupt_chunks_total, kvarena_tier_errors_total (counters);
//   kvarena_tier_duration_seconds{medium,op="read"|"write"} (histogram of store calls).
// Thread-safety: TierLatency is safe for concurrent use.
#ifndef KVARENA_DAEMON_TIER_METRICS_H_
#define KVARENA_DAEMON_TIER_METRICS_H_

#include <array>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/types.h"
#include "daemon/rpc_metrics.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "tiers/redis/redis_reply.h"

namespace kvarena {

// How long the tiers' store reads and writes took (TierOptions::on_latency).
class TierLatency {
 public:
  static constexpr std::array<const char*, 3> kMedia = {"host", "disk", "redis"};
  void Record(const std::string& medium, bool write, absl::Duration took);
  LatencySnapshot Snapshot(size_t medium, bool write) const;

 private:
  std::array<std::array<LatencyHistogram, 2>, kMedia.size()> latency_{};
};

void AddTierMetrics(const std::vector<TierStats>& tiers, const TierLatency* latency,
                    std::vector<prometheus::MetricFamily>* out);

// The cluster client's counters (tiers/redis/): kvarena_tier_redis_redirects_total{kind=
// "moved"|"ask"}, kvarena_tier_redis_retries_total, _errors_total, _timeouts_total,
// _breaker_opens_total, _breaker_skips_total, _slot_refreshes_total.
void AddRedisMetrics(const RedisCounterValues& c, std::vector<prometheus::MetricFamily>* out);

// A histogram sample over kLatencyBoundsNanos (shared with the RPC families).
prometheus::ClientMetric HistogramMetric(const LatencySnapshot& h,
                                         std::vector<prometheus::ClientMetric::Label> labels);

}  // namespace kvarena

#endif  // KVARENA_DAEMON_TIER_METRICS_H_
