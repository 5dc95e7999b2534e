#include "tools/commands.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.pb.h"
#include "kvarena/v1/kvarena.pb.h"
#include "proto/wire.h"
#include "tools/table.h"

namespace kvarena {
namespace {

CommandResult Print(std::string out) {
  CommandResult r;
  r.out = std::move(out);
  return r;
}

CommandResult Fail(const absl::Status& s) {
  CommandResult r;
  r.status = absl::Status(s.code(), ForTerminal(s.message()));  // may echo a caller's cache id
  r.exit_code = 1;
  return r;
}

CommandResult Json(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  CommandResult r;
  auto s = google::protobuf::util::MessageToJsonString(m, &r.out, options);
  if (!s.ok()) return Fail(absl::InternalError(absl::StrCat("json: ", s.ToString())));
  return r;
}

std::string PageSizeText(int page_size) {
  return page_size > 0 ? absl::StrCat(page_size) : std::string("mixed");
}

std::string ArenaText(const std::string& address, const ArenaStats& s) {
  const PageStats& p = s.pages;
  std::string out = absl::StrCat("kvarena at ", address, " (backend ", s.backend, ")\n");
  Table t;
  t.AddRow(
      {"pages", absl::StrCat("used ", p.pages_used, "  free ", p.pages_free, "  total ",
                             p.num_pages, "  (page size ", PageSizeText(p.page_size), " tokens)")});
  t.AddRow({"bytes",
            absl::StrCat("used ", HumanBytes(s.bytes_used), "  committed ",
                         HumanBytes(s.bytes_committed), " (scratch ", HumanBytes(s.scratch_bytes),
                         ")  budget ", HumanBytes(s.arena_bytes))});
  t.AddRow({"metadata", absl::StrCat("used ", HumanBytes(s.metadata_bytes_used), "  budget ",
                                     HumanBytes(s.metadata_bytes), "  event log ",
                                     HumanBytes(s.event_log_bytes))});
  t.AddRow(
      {"caches", absl::StrCat(s.num_caches, "  sessions ", s.num_sessions, "  tokens ", p.seq_len,
                              "  layers ", p.layers_materialized, "/", p.layers_total,
                              " materialized, ", p.layers_sliding, " sliding")});
  t.AddRow({"events", absl::StrCat("pages evicted ", p.pages_evicted, "  refusals ", p.refusals)});
  absl::StrAppend(&out, t.Render());
  if (s.pools.empty()) return absl::StrCat(out, "\nno pools yet\n");
  Table pools({"POOL", "KV_HEADS", "HEAD_DIM", "DTYPE", "PAGE", "PAGE_BYTES", "USED", "FREE",
               "TOTAL", "CHUNKS", "COMMITTED", "CACHES"});
  for (const PoolStats& ps : s.pools) {
    pools.AddRow({absl::StrCat(ps.pool_id), absl::StrCat(ps.layout.num_kv_heads),
                  absl::StrCat(ps.layout.head_dim), DTypeName(ps.layout.dtype),
                  absl::StrCat(ps.layout.page_size), HumanBytes(ps.page_bytes),
                  absl::StrCat(ps.pages_used), absl::StrCat(ps.pages_free),
                  absl::StrCat(ps.num_pages), absl::StrCat(ps.chunks_committed),
                  HumanBytes(ps.bytes_committed), absl::StrCat(ps.num_caches)});
  }
  absl::StrAppend(&out, "\n", pools.Render());
  if (s.tiers.empty()) return out;
  Table tiers({"TIER", "UP", "USED", "LIMIT", "CHUNKS", "LOOKUPS", "HITS", "MISSES",
               "LOADED_TOKENS", "STORED", "DROPPED", "CORRUPT", "ERRORS"});
  for (const TierStats& t : s.tiers) {
    tiers.AddRow({t.medium, t.up ? "yes" : "no", HumanBytes(t.bytes_used),
                  t.bytes_limit > 0 ? HumanBytes(t.bytes_limit) : std::string("-"),
                  absl::StrCat(t.chunks), absl::StrCat(t.lookups), absl::StrCat(t.hit_chunks),
                  absl::StrCat(t.miss_chunks), absl::StrCat(t.loaded_tokens),
                  absl::StrCat(t.stored_chunks), absl::StrCat(t.dropped_writes),
                  absl::StrCat(t.corrupt_chunks), absl::StrCat(t.errors)});
  }
  return absl::StrCat(out, "\n", tiers.Render());
}

std::string CacheText(const std::string& cache_id, const PageStats& p) {
  std::string out = absl::StrCat("cache ", ForTerminal(cache_id), "\n");
  Table t;
  t.AddRow({"pages", absl::StrCat("used ", p.pages_used, "  (page size ", PageSizeText(p.page_size),
                                  " tokens, ", HumanBytes(p.bytes_used), ")")});
  t.AddRow({"tokens", absl::StrCat(p.seq_len)});
  t.AddRow({"layers", absl::StrCat(p.layers_total, "  materialized ", p.layers_materialized,
                                   "  sliding ", p.layers_sliding)});
  t.AddRow({"events", absl::StrCat("pages evicted ", p.pages_evicted, "  refusals ", p.refusals)});
  return absl::StrCat(out, t.Render());
}

}  // namespace

CommandResult StatsCommand(Client& client, const std::string& cache_id, bool json) {
  if (!cache_id.empty()) {
    auto p = client.CacheStats(cache_id);
    if (!p.ok()) return Fail(p.status());
    if (!json) return Print(CacheText(cache_id, *p));
    v1::PageStats m;
    ToProto(*p, &m);
    return Json(m);
  }
  auto s = client.Stats();
  if (!s.ok()) return Fail(s.status());
  if (!json) return Print(ArenaText(client.address(), *s));
  v1::StatsResponse m;
  ToProto(*s, &m);
  return Json(m);
}

CommandResult CachesCommand(Client& client, bool json) {
  auto caches = client.ListCaches();
  if (!caches.ok()) return Fail(caches.status());
  if (json) {
    v1::ListCachesResponse m;
    for (const CacheInfo& c : *caches) ToProto(c, m.add_caches());
    return Json(m);
  }
  if (caches->empty()) return Print("no caches\n");
  Table t({"CACHE_ID", "LAYERS", "KV_HEADS", "HEAD_DIM", "DTYPE", "PAGE", "SEQ_LEN", "PAGES",
           "WINDOWS"});
  for (const CacheInfo& c : *caches) {
    // Released between the list and this call: show it as gone rather than fail.
    auto p = client.CacheStats(c.cache_id);
    std::vector<std::string> windows;
    for (int w : c.spec.layer_windows) {
      if (w > 0) windows.push_back(absl::StrCat(w));
    }
    t.AddRow({c.cache_id, absl::StrCat(c.spec.num_layers), absl::StrCat(c.spec.num_kv_heads),
              absl::StrCat(c.spec.head_dim), DTypeName(c.spec.dtype),
              absl::StrCat(c.spec.page_size), absl::StrCat(c.seq_len),
              p.ok() ? absl::StrCat(p->pages_used) : std::string("-"),
              windows.empty()
                  ? std::string("global")
                  : absl::StrCat(windows.size(), " sliding (", absl::StrJoin(windows, ","), ")")});
  }
  return Print(t.Render());
}

CommandResult HealthCommand(Client& client, const std::string& service, bool json) {
  auto h = client.Health(service);
  if (!h.ok()) {
    CommandResult r = Fail(h.status());
    if (!json) r.out = "NOT_SERVING\n";
    return r;
  }
  CommandResult r;
  if (json) {
    grpc::health::v1::HealthCheckResponse m;
    m.set_status(static_cast<grpc::health::v1::HealthCheckResponse::ServingStatus>(*h));
    r = Json(m);
  } else {
    r.out = absl::StrCat(ServingStatusName(*h), "\n");
  }
  r.exit_code = *h == ServingStatus::kServing ? 0 : 1;
  return r;
}

}  // namespace kvarena
