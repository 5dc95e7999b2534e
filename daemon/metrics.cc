#include "daemon/metrics.h"

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/prefix_metrics.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"

namespace kvarena {
namespace {

// civetweb (under prometheus-cpp) gives each connection a thread until its request has
// come and been answered, waiting up to request_timeout_ms for it (30 s by default, with 2
// threads): two idle connections stalled every scrape for 30 s. With these, a scrape
// waits at most kMetricsRequestTimeout however many idle connections are open.
constexpr int kMetricsThreads = 8;
constexpr absl::Duration kMetricsRequestTimeout = absl::Seconds(2);

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void Add(MetricFamily* f, double value, Labels labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  if (f->type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f->metric.push_back(std::move(m));
}

MetricFamily Scalar(std::string name, std::string help, double value,
                    MetricType type = MetricType::Gauge) {
  MetricFamily f = Family(std::move(name), std::move(help), type);
  Add(&f, value);
  return f;
}

// "OK", "NOT_FOUND", ...: absl's names are gRPC's canonical ones.
std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

void AddArenaFamilies(const ArenaStats& s, std::vector<MetricFamily>* out) {
  MetricFamily info =
      Family("kvarena_info", "Constant 1, labelled with the backend.", MetricType::Gauge);
  Add(&info, 1, {{"backend", s.backend}});
  out->push_back(std::move(info));
  out->push_back(
      Scalar("kvarena_arena_bytes", "The arena budget (--arena_bytes).", double(s.arena_bytes)));
  out->push_back(
      Scalar("kvarena_bytes_committed",
             "Bytes charged to the budget: pools' committed chunks and sessions' scratch.",
             double(s.bytes_committed)));
  out->push_back(Scalar("kvarena_arena_warm_bytes",
                        "Of kvarena_bytes_committed, empty chunks kept resident for the next "
                        "pages (--arena_warm_bytes).",
                        double(s.warm_bytes)));
  out->push_back(Scalar("kvarena_arena_huge_pages",
                        "1 when the arena's pages are huge pages (host: shared-memory THP "
                        "allows MADV_HUGEPAGE), else 0.",
                        s.huge_pages ? 1.0 : 0.0));
  out->push_back(Scalar("kvarena_scratch_bytes", "Bytes of live sessions' scratch regions.",
                        double(s.scratch_bytes)));
  out->push_back(Scalar("kvarena_metadata_bytes", "The bookkeeping budget (--metadata_bytes).",
                        double(s.metadata_bytes)));
  out->push_back(
      Scalar("kvarena_metadata_bytes_used",
             "Bookkeeping charged: caches' tables, declared token ids, prefix-index nodes.",
             double(s.metadata_bytes_used)));
  out->push_back(
      Scalar("kvarena_cached_metadata_bytes",
             "Of kvarena_metadata_bytes_used, what prefixes no cache holds keep (cached).",
             double(s.cached_metadata_bytes)));
  out->push_back(Scalar("kvarena_cached_metadata_limit",
                        "What cached prefixes may keep of the budget (--cached_metadata_bytes).",
                        double(s.cached_metadata_limit)));
  out->push_back(Scalar("kvarena_event_log_bytes",
                        "Bytes of prefix-index events kept for WatchEvents (--event_log_bytes).",
                        double(s.event_log_bytes)));
  out->push_back(
      Scalar("kvarena_bytes_used", "Bytes of pages held by caches.", double(s.bytes_used)));
  out->push_back(Scalar("kvarena_pages_total", "Pages over every pool (used + free).",
                        double(s.pages.num_pages)));
  out->push_back(Scalar("kvarena_pages_used", "Pages held by caches, every pool.",
                        double(s.pages.pages_used)));
  out->push_back(
      Scalar("kvarena_pages_free", "Free pages, every pool.", double(s.pages.pages_free)));
  out->push_back(Scalar("kvarena_caches", "Live caches.", double(s.num_caches)));
  out->push_back(Scalar("kvarena_tokens", "Tokens held, summed over caches (seq_len).",
                        double(s.pages.seq_len)));
  out->push_back(Scalar("kvarena_pages_evicted_total", "Pages freed by sliding windows.",
                        double(s.pages.pages_evicted), MetricType::Counter));
  out->push_back(Scalar("kvarena_refusals_total", "Refused popn and rejected appends / reserves.",
                        double(s.pages.refusals), MetricType::Counter));
}

// One family per pool field, one sample per pool, labelled by the pool's geometry (which
// names it: one pool per geometry). Not by pool id: a geometry's pool gets a new id
// each time its last cache goes and a new one comes, and series would pile up.
void AddPoolFamilies(const std::vector<PoolStats>& pools, std::vector<MetricFamily>* out) {
  struct Field {
    const char* name;
    const char* help;
    double (*get)(const PoolStats&);
  };
  static constexpr Field kFields[] = {
      {"kvarena_pool_pages_total", "Pages the pool could hold now (used + free).",
       [](const PoolStats& p) { return double(p.num_pages); }},
      {"kvarena_pool_pages_used", "Pages of the pool held by caches.",
       [](const PoolStats& p) { return double(p.pages_used); }},
      {"kvarena_pool_pages_free", "Free pages: in committed chunks plus the uncommitted budget.",
       [](const PoolStats& p) { return double(p.pages_free); }},
      {"kvarena_pool_page_bytes", "Bytes of one page (K and V of page_size tokens).",
       [](const PoolStats& p) { return double(p.page_bytes); }},
      {"kvarena_pool_bytes_used", "Bytes of the pool's pages held by caches.",
       [](const PoolStats& p) { return double(p.pages_used) * double(p.page_bytes); }},
      {"kvarena_pool_chunks_committed", "Chunks of physical memory the pool holds.",
       [](const PoolStats& p) { return double(p.chunks_committed); }},
      {"kvarena_pool_bytes_committed", "Physical bytes the pool holds.",
       [](const PoolStats& p) { return double(p.bytes_committed); }},
      {"kvarena_pool_caches", "Caches drawing from the pool.",
       [](const PoolStats& p) { return double(p.num_caches); }},
  };
  for (const Field& field : kFields) {
    MetricFamily f = Family(field.name, field.help, MetricType::Gauge);
    for (const PoolStats& p : pools) {
      Add(&f, field.get(p),
          {{"dtype", DTypeName(p.layout.dtype)},
           {"kv_format", KvFormatName(p.layout.format())},
           {"num_kv_heads", absl::StrCat(p.layout.num_kv_heads)},
           {"head_dim", absl::StrCat(p.layout.head_dim)},
           {"page_size", absl::StrCat(p.layout.page_size)}});
    }
    out->push_back(std::move(f));
  }
}

void AddSessionFamilies(const ArenaStats& s, std::vector<MetricFamily>* out) {
  out->push_back(Scalar("kvarena_sessions", "Sessions held: attached or in their grace period.",
                        double(s.num_sessions)));
  out->push_back(Scalar("kvarena_sessions_attached", "Sessions whose Attach stream is open.",
                        double(s.num_sessions - s.sessions_in_grace)));
  out->push_back(Scalar("kvarena_sessions_in_grace",
                        "Sessions whose stream ended, their caches kept for --session_grace.",
                        double(s.sessions_in_grace)));
  out->push_back(Scalar("kvarena_sessions_opened_total", "Sessions opened (Attach accepted).",
                        double(s.sessions_opened), MetricType::Counter));
  out->push_back(Scalar("kvarena_sessions_detached_total",
                        "Sessions whose Attach stream ended (their grace began).",
                        double(s.sessions_detached), MetricType::Counter));
  out->push_back(Scalar("kvarena_sessions_resumed_total",
                        "Sessions taken back by an Attach with their resume token.",
                        double(s.sessions_resumed), MetricType::Counter));
  out->push_back(Scalar("kvarena_sessions_reaped_total",
                        "Sessions removed when their grace ran out, their caches released.",
                        double(s.sessions_reaped), MetricType::Counter));
  MetricFamily reaped = Family("kvarena_caches_reaped_total",
                               "Caches the reaper released: a reaped session's (session_grace) "
                               "or sessionless ones idle past --idle_ttl (idle_ttl).",
                               MetricType::Counter);
  Add(&reaped, double(s.caches_reaped_grace), {{"reason", "session_grace"}});
  Add(&reaped, double(s.caches_reaped_idle), {{"reason", "idle_ttl"}});
  out->push_back(std::move(reaped));
}

}  // namespace

ClientMetric HistogramMetric(const LatencySnapshot& h, Labels labels) {
  ClientMetric m;
  m.label = std::move(labels);
  m.histogram.sample_count = h.count;
  m.histogram.sample_sum = absl::ToDoubleSeconds(h.sum);
  uint64_t cumulative = 0;
  for (size_t b = 0; b < kLatencyBoundsNanos.size(); ++b) {
    cumulative += h.buckets[b];
    m.histogram.bucket.push_back({cumulative, double(kLatencyBoundsNanos[b]) / 1e9});
  }
  // The serializer adds le="+Inf" with sample_count, the sum of every bucket.
  return m;
}

namespace {

void AddRpcFamilies(const RpcMetrics& rpcs, std::vector<MetricFamily>* out) {
  MetricFamily calls = Family("kvarena_rpc_total",
                              "KvCacheService calls by method and status code (Attach when "
                              "its stream ends).",
                              MetricType::Counter);
  MetricFamily latency = Family("kvarena_rpc_duration_seconds",
                                "How long unary KvCacheService handlers ran (decode, core, "
                                "encode), by method and status code.",
                                MetricType::Histogram);
  MetricFamily refused = Family("kvarena_resource_exhausted_total",
                                "KvCacheService calls refused RESOURCE_EXHAUSTED, by method and "
                                "the bound they met.",
                                MetricType::Counter);
  for (int r = 0; r < kNumRpcs; ++r) {
    const Rpc rpc = static_cast<Rpc>(r);
    for (int c = 0; c < kNumStatusCodes; ++c) {
      const auto code = static_cast<absl::StatusCode>(c);
      const Labels labels = {{"method", RpcName(rpc)}, {"code", CodeName(c)}};
      if (const uint64_t n = rpcs.Calls(rpc, code); n != 0) Add(&calls, double(n), labels);
      const LatencySnapshot h = rpcs.Latency(rpc, code);
      if (h.count != 0) latency.metric.push_back(HistogramMetric(h, labels));
    }
    for (int reason = 0; reason < kNumRefusals; ++reason) {
      const uint64_t n = rpcs.Refusals(rpc, static_cast<Refusal>(reason));
      if (n == 0) continue;
      Add(&refused, double(n),
          {{"method", RpcName(rpc)}, {"reason", RefusalName(static_cast<Refusal>(reason))}});
    }
  }
  out->push_back(std::move(calls));
  out->push_back(std::move(latency));
  out->push_back(std::move(refused));
}

void AddFdFamilies(const FdMetrics& fd, std::vector<MetricFamily>* out) {
  MetricFamily requests =
      Family("kvarena_fd_requests_total", "fd-socket requests by operation and reply code.",
             MetricType::Counter);
  for (int op = 0; op < kNumFdOps; ++op) {
    for (int c = 0; c < kNumStatusCodes; ++c) {
      const uint64_t n = fd.requests(static_cast<FdOp>(op), static_cast<absl::StatusCode>(c));
      if (n == 0) continue;
      Add(&requests, double(n), {{"op", FdOpName(static_cast<FdOp>(op))}, {"code", CodeName(c)}});
    }
  }
  out->push_back(std::move(requests));
  out->push_back(Scalar("kvarena_fd_exported_fds_total",
                        "File descriptors the fd socket sent (pool and scratch pieces).",
                        double(fd.fds_exported()), MetricType::Counter));
  out->push_back(Scalar("kvarena_fd_exported_bytes_total",
                        "Bytes of memory the sent file descriptors map.",
                        double(fd.bytes_exported()), MetricType::Counter));
  out->push_back(
      Scalar("kvarena_fd_connections", "Open fd-socket connections.", double(fd.connections())));
  out->push_back(Scalar("kvarena_fd_connections_refused_total",
                        "fd-socket connections closed at once: over --max_fd_connections.",
                        double(fd.connections_refused()), MetricType::Counter));
}

class StoreCollector : public prometheus::Collectable {
 public:
  explicit StoreCollector(MetricSources sources) : sources_(sources) {}
  std::vector<MetricFamily> Collect() const override { return CollectMetrics(sources_); }

 private:
  const MetricSources sources_;
};

}  // namespace

std::vector<MetricFamily> CollectMetrics(const MetricSources& sources) {
  const ArenaStats s = sources.store->Stats();
  std::vector<MetricFamily> out;
  AddArenaFamilies(s, &out);
  AddPoolFamilies(s.pools, &out);
  AddSessionFamilies(s, &out);
  AddRpcFamilies(*sources.rpcs, &out);
  AddFdFamilies(*sources.fd, &out);
  AddPrefixMetrics(s, &out);
  AddTierMetrics(s.tiers, sources.tiers, &out);
  if (sources.redis != nullptr) AddRedisMetrics(sources.redis->cluster_counters(), &out);
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    int port,
                                                                    MetricSources sources) {
  const bool ipv6 = absl::StrContains(address, ':') && !absl::StartsWith(address, "[");
  std::unique_ptr<MetricsServer> server(new MetricsServer(
      ipv6 ? absl::StrCat("[", address, "]:", port) : absl::StrCat(address, ":", port)));
  server->collector_ = std::make_shared<StoreCollector>(sources);
  try {  // prometheus-cpp (civetweb) reports an address it cannot bind by throwing
    server->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", server->bind_address_, "num_threads", std::to_string(kMetricsThreads),
        "request_timeout_ms", std::to_string(absl::ToInt64Milliseconds(kMetricsRequestTimeout))});
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("--metrics_address=", address, " --metrics_port=",
                                               port, ": cannot serve metrics: ", e.what()));
  }
  server->exposer_->RegisterCollectable(server->collector_);
  return server;
}

MetricsServer::MetricsServer(std::string bind_address) : bind_address_(std::move(bind_address)) {}
MetricsServer::~MetricsServer() = default;

}  // namespace kvarena
