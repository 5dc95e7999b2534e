#include "daemon/prefix_metrics.h"

#include <string>
#include <utility>

namespace kvarena {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily One(std::string name, std::string help, MetricType type, double value,
                 std::vector<ClientMetric::Label> labels = {}) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  ClientMetric m;
  m.label = std::move(labels);
  if (type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
  return f;
}

}  // namespace

void AddPrefixMetrics(const ArenaStats& stats, std::vector<MetricFamily>* out) {
  const PageStats& p = stats.pages;
  out->push_back(
      One("kvarena_pages_cached",
          "Unreferenced pages kept for prefix hits (reclaimable; counted in kvarena_pages_free).",
          MetricType::Gauge, double(p.pages_cached)));
  out->push_back(One("kvarena_pages_shared", "Pages referenced by two or more caches.",
                     MetricType::Gauge, double(p.pages_shared)));
  out->push_back(One("kvarena_prefix_lookups_total",
                     "Allocates with prompt_tokens and a prefix namespace.", MetricType::Counter,
                     double(p.prefix_lookups)));
  out->push_back(One("kvarena_prefix_requested_tokens_total",
                     "Prompt tokens those lookups asked for.", MetricType::Counter,
                     double(p.prefix_requested_tokens)));
  out->push_back(One("kvarena_prefix_hit_tokens_total",
                     "Prompt tokens found cached (CacheInfo.cached_tokens).", MetricType::Counter,
                     double(p.prefix_hit_tokens)));
  out->push_back(One("kvarena_forks_total", "Fork calls that made a cache.", MetricType::Counter,
                     double(p.forks)));
  out->push_back(One("kvarena_cow_copies_total",
                     "Pages copied because a popn cut into a shared page.", MetricType::Counter,
                     double(p.cow_copies)));
  MetricFamily evicted =
      One("kvarena_pages_evicted_by_reason_total",
          "Pages evicted: by sliding windows, or cached pages reclaimed (LRU) for allocations "
          "or to give metadata back.",
          MetricType::Counter, double(p.pages_evicted), {{"reason", "window"}});
  ClientMetric lru;
  lru.label = {{"reason", "lru"}};
  lru.counter.value = double(p.pages_evicted_lru);
  evicted.metric.push_back(std::move(lru));
  ClientMetric metadata;
  metadata.label = {{"reason", "metadata"}};
  metadata.counter.value = double(p.pages_reclaimed_for_metadata);
  evicted.metric.push_back(std::move(metadata));
  out->push_back(std::move(evicted));
}

}  // namespace kvarena
