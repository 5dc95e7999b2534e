// The prefix-reuse families of kvarenad's /metrics (docs/prefix-reuse.md), kept apart
// from daemon/metrics.cc so that CollectMetrics adds them with one call:
//   kvarena_pages_cached, kvarena_pages_shared (gauges);
//   kvarena_prefix_lookups_total, kvarena_prefix_requested_tokens_total,
//   kvarena_prefix_hit_tokens_total, kvarena_forks_total, kvarena_cow_copies_total,
//   kvarena_pages_evicted_by_reason_total{reason="window"|"lru"} (counters).
// Pure function of the stats; thread-safe.
#ifndef KVARENA_DAEMON_PREFIX_METRICS_H_
#define KVARENA_DAEMON_PREFIX_METRICS_H_

#include <vector>

#include "core/types.h"
#include "prometheus/metric_family.h"

namespace kvarena {

void AddPrefixMetrics(const ArenaStats& stats, std::vector<prometheus::MetricFamily>* out);

}  // namespace kvarena

#endif  // KVARENA_DAEMON_PREFIX_METRICS_H_
