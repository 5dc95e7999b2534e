#include "daemon/metrics.h"
#include "daemon/prefix_metrics.h"

#include <exception>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"

namespace kvarena {

const char* RpcName(Rpc rpc) {
  switch (rpc) {
    case Rpc::kAllocate: return "Allocate";
    case Rpc::kAppend: return "Append";
    case Rpc::kAttend: return "Attend";
    case Rpc::kPopn: return "Popn";
    case Rpc::kReset: return "Reset";
    case Rpc::kRelease: return "Release";
    case Rpc::kReserve: return "Reserve";
    case Rpc::kCommit: return "Commit";
    case Rpc::kGetKv: return "GetKv";
    case Rpc::kDescribe: return "Describe";
    case Rpc::kStats: return "Stats";
    case Rpc::kListCaches: return "ListCaches";
    case Rpc::kAttach: return "Attach";
    case Rpc::kPing: return "Ping";
    case Rpc::kSetTokens: return "SetTokens";
    case Rpc::kFork: return "Fork";
    case Rpc::kWatchEvents: return "WatchEvents";
  }
  return "unknown";
}

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void Add(MetricFamily* f, double value, std::vector<ClientMetric::Label> labels = {}) {
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

// One family per pool field, one sample per pool, labelled by the pool's geometry.
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
          {{"pool_id", absl::StrCat(p.pool_id)},
           {"dtype", DTypeName(p.layout.dtype)},
           {"num_kv_heads", absl::StrCat(p.layout.num_kv_heads)},
           {"head_dim", absl::StrCat(p.layout.head_dim)},
           {"page_size", absl::StrCat(p.layout.page_size)}});
    }
    out->push_back(std::move(f));
  }
}

void AddRpcFamily(const RpcCounters& rpcs, std::vector<MetricFamily>* out) {
  MetricFamily f = Family("kvarena_rpc_total", "KvCacheService calls by method and status code.",
                          MetricType::Counter);
  for (int r = 0; r < kNumRpcs; ++r) {
    for (int c = 0; c < kNumStatusCodes; ++c) {
      const auto code = static_cast<absl::StatusCode>(c);
      const uint64_t n = rpcs.Get(static_cast<Rpc>(r), code);
      if (n == 0) continue;
      Add(&f, double(n),
          {{"method", RpcName(static_cast<Rpc>(r))}, {"code", absl::StatusCodeToString(code)}});
    }
  }
  out->push_back(std::move(f));
}

class StoreCollector : public prometheus::Collectable {
 public:
  StoreCollector(const KvStore* store, const RpcCounters* rpcs) : store_(store), rpcs_(rpcs) {}
  std::vector<MetricFamily> Collect() const override { return CollectMetrics(*store_, *rpcs_); }

 private:
  const KvStore* store_;
  const RpcCounters* rpcs_;
};

}  // namespace

std::vector<MetricFamily> CollectMetrics(const KvStore& store, const RpcCounters& rpcs) {
  const ArenaStats s = store.Stats();
  std::vector<MetricFamily> out;
  MetricFamily info = Family("kvarena_info", "Constant 1, labelled with the backend.",
                             MetricType::Gauge);
  Add(&info, 1, {{"backend", s.backend}});
  out.push_back(std::move(info));
  out.push_back(Scalar("kvarena_arena_bytes", "The arena budget (--arena_bytes).",
                       double(s.arena_bytes)));
  out.push_back(Scalar("kvarena_bytes_committed",
                       "Bytes charged to the budget: pools' committed chunks and sessions' scratch.",
                       double(s.bytes_committed)));
  out.push_back(Scalar("kvarena_scratch_bytes", "Bytes of live sessions' scratch regions.",
                       double(s.scratch_bytes)));
  out.push_back(Scalar("kvarena_bytes_used", "Bytes of pages held by caches.",
                       double(s.bytes_used)));
  out.push_back(Scalar("kvarena_pages_total", "Pages over every pool (used + free).",
                       double(s.pages.num_pages)));
  out.push_back(Scalar("kvarena_pages_used", "Pages held by caches, every pool.",
                       double(s.pages.pages_used)));
  out.push_back(Scalar("kvarena_pages_free", "Free pages, every pool.",
                       double(s.pages.pages_free)));
  out.push_back(Scalar("kvarena_caches", "Live caches.", double(s.num_caches)));
  out.push_back(Scalar("kvarena_sessions", "Attached or in-grace sessions.",
                       double(s.num_sessions)));
  out.push_back(Scalar("kvarena_tokens", "Tokens held, summed over caches (seq_len).",
                       double(s.pages.seq_len)));
  out.push_back(Scalar("kvarena_pages_evicted_total", "Pages freed by sliding windows.",
                       double(s.pages.pages_evicted), MetricType::Counter));
  out.push_back(Scalar("kvarena_refusals_total",
                       "Refused popn and rejected appends / reserves.",
                       double(s.pages.refusals), MetricType::Counter));
  AddPoolFamilies(s.pools, &out);
  AddRpcFamily(rpcs, &out);
  AddPrefixMetrics(s, &out);
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    int port,
                                                                    const KvStore* store,
                                                                    const RpcCounters* rpcs) {
  const bool ipv6 = absl::StrContains(address, ':') && !absl::StartsWith(address, "[");
  std::unique_ptr<MetricsServer> server(new MetricsServer(
      ipv6 ? absl::StrCat("[", address, "]:", port) : absl::StrCat(address, ":", port)));
  server->collector_ = std::make_shared<StoreCollector>(store, rpcs);
  try {  // prometheus-cpp (civetweb) reports an address it cannot bind by throwing
    server->exposer_ = std::make_unique<prometheus::Exposer>(server->bind_address_);
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
