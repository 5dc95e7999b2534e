#include "daemon/tier_metrics.h"

#include <utility>

namespace kvarena {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

void TierLatency::Record(const std::string& medium, bool write, absl::Duration took) {
  for (size_t i = 0; i < kMedia.size(); ++i) {
    if (medium == kMedia[i]) latency_[i][write ? 1 : 0].Record(took);
  }
}

LatencySnapshot TierLatency::Snapshot(size_t medium, bool write) const {
  return latency_[medium][write ? 1 : 0].Snapshot();
}

namespace {

MetricFamily PerMedium(const std::vector<TierStats>& tiers, std::string name, std::string help,
                       MetricType type, double (*value)(const TierStats&)) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  for (const TierStats& t : tiers) {
    ClientMetric m;
    m.label = {{"medium", t.medium}};
    if (type == MetricType::Counter)
      m.counter.value = value(t);
    else
      m.gauge.value = value(t);
    f.metric.push_back(std::move(m));
  }
  return f;
}

}  // namespace

void AddTierMetrics(const std::vector<TierStats>& tiers, const TierLatency* latency,
                    std::vector<MetricFamily>* out) {
  if (tiers.empty()) return;
  const MetricType g = MetricType::Gauge, c = MetricType::Counter;
  out->push_back(PerMedium(tiers, "kvarena_tier_bytes_used", "Bytes of chunks a tier holds.", g,
                           [](const TierStats& t) { return double(t.bytes_used); }));
  out->push_back(
      PerMedium(tiers, "kvarena_tier_bytes_limit",
                "A tier's byte limit (--tier_host_bytes, --tier_disk_bytes; 0: none of its own).",
                g, [](const TierStats& t) { return double(t.bytes_limit); }));
  out->push_back(PerMedium(tiers, "kvarena_tier_chunks", "Chunks a tier holds.", g,
                           [](const TierStats& t) { return double(t.chunks); }));
  out->push_back(PerMedium(tiers, "kvarena_tier_up", "1 while the tier's medium can be reached.", g,
                           [](const TierStats& t) { return t.up ? 1.0 : 0.0; }));
  out->push_back(PerMedium(tiers, "kvarena_tier_lookups_total", "Chunks looked up in a tier.", c,
                           [](const TierStats& t) { return double(t.lookups); }));
  out->push_back(PerMedium(tiers, "kvarena_tier_hit_chunks_total", "Chunks a tier had, verified.",
                           c, [](const TierStats& t) { return double(t.hit_chunks); }));
  out->push_back(
      PerMedium(tiers, "kvarena_tier_miss_chunks_total",
                "Chunks a tier did not have (or could not read, or failed verification).", c,
                [](const TierStats& t) { return double(t.miss_chunks); }));
  out->push_back(
      PerMedium(tiers, "kvarena_tier_loaded_tokens_total",
                "Prompt positions caches took from a tier's chunks (CacheInfo.tier_loaded_tokens).",
                c, [](const TierStats& t) { return double(t.loaded_tokens); }));
  out->push_back(PerMedium(tiers, "kvarena_tier_stored_chunks_total", "Chunks written to a tier.",
                           c, [](const TierStats& t) { return double(t.stored_chunks); }));
  out->push_back(
      PerMedium(tiers, "kvarena_tier_dropped_writes_total",
                "Chunk writes dropped: the write queue full, or the tier unable to fit them.", c,
                [](const TierStats& t) { return double(t.dropped_writes); }));
  out->push_back(
      PerMedium(tiers, "kvarena_tier_corrupt_chunks_total",
                "Chunks read from a tier that failed verification (then dropped from it).", c,
                [](const TierStats& t) { return double(t.corrupt_chunks); }));
  out->push_back(PerMedium(tiers, "kvarena_tier_errors_total", "Tier reads and writes that failed.",
                           c, [](const TierStats& t) { return double(t.errors); }));
  if (latency == nullptr) return;
  MetricFamily h;
  h.name = "kvarena_tier_duration_seconds";
  h.help = "How long a tier's reads and writes of one chunk took.";
  h.type = MetricType::Histogram;
  for (size_t i = 0; i < TierLatency::kMedia.size(); ++i) {
    for (bool write : {false, true}) {
      const LatencySnapshot s = latency->Snapshot(i, write);
      if (s.count == 0) continue;
      h.metric.push_back(HistogramMetric(
          s, {{"medium", TierLatency::kMedia[i]}, {"op", write ? "write" : "read"}}));
    }
  }
  out->push_back(std::move(h));
}

void AddRedisMetrics(const RedisCounterValues& c, std::vector<MetricFamily>* out) {
  auto counter = [out](std::string name, std::string help, double v,
                       std::vector<ClientMetric::Label> labels = {}) {
    MetricFamily* f = nullptr;
    for (MetricFamily& x : *out) {
      if (x.name == name) f = &x;
    }
    if (f == nullptr) {
      out->push_back(MetricFamily{std::move(name), std::move(help), MetricType::Counter, {}});
      f = &out->back();
    }
    ClientMetric m;
    m.label = std::move(labels);
    m.counter.value = v;
    f->metric.push_back(std::move(m));
  };
  const std::string redirects = "Redis Cluster redirects the tier's client followed, by kind.";
  counter("kvarena_tier_redis_redirects_total", redirects, double(c.moved), {{"kind", "moved"}});
  counter("kvarena_tier_redis_redirects_total", redirects, double(c.ask), {{"kind", "ask"}});
  counter("kvarena_tier_redis_retries_total",
          "TRYAGAIN, CLUSTERDOWN and LOADING replies backed off.", double(c.retries));
  counter("kvarena_tier_redis_errors_total", "Redis error replies and transport failures.",
          double(c.errors));
  counter("kvarena_tier_redis_timeouts_total",
          "Redis connects, reads or writes that ran out of time.", double(c.timeouts));
  counter("kvarena_tier_redis_breaker_opens_total", "Times a Redis node's circuit breaker opened.",
          double(c.breaker_opens));
  counter("kvarena_tier_redis_breaker_skips_total",
          "Redis commands not sent because their node's breaker was open (a miss at once).",
          double(c.breaker_skips));
  counter("kvarena_tier_redis_slot_refreshes_total", "Redis Cluster slot maps loaded.",
          double(c.slot_refreshes));
}

}  // namespace kvarena
