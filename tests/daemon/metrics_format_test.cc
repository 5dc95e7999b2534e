// The exposition kvarenad serves, without a daemon: CollectMetrics over a real KvStore and
// hand-fed RPC and fd-socket metrics, written by prometheus-cpp's text serializer (what
// the endpoint runs) and read back by a strict format-0.0.4 reader
// (tests/daemon/prometheus_text.h), whose own refusals are checked here too.
#include <sstream>
#include <string>
#include <vector>

#include "base/clock.h"
#include "core/kv_store.h"
#include "core/refusal.h"
#include "daemon/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "tests/daemon/prometheus_text.h"

namespace kvarena {
namespace {

using ::kvarena::testing::Exposition;
using ::kvarena::testing::ParseExposition;
using ::kvarena::testing::PromLabels;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Serialize(const std::vector<prometheus::MetricFamily>& families) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

CacheSpec SmallSpec(int64_t max_tokens = 0) {
  CacheSpec s;
  s.num_layers = 1;
  s.num_kv_heads = 2;
  s.head_dim = 8;
  s.dtype = DType::kFloat32;
  s.page_size = 4;
  s.max_tokens = max_tokens;
  return s;
}

class MetricsFormatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions o;
    o.arena_bytes = size_t{16} << 20;
    o.num_threads = 1;
    o.scratch_bytes = 0;
    o.clock = &clock_;
    auto store = KvStore::Create(o, NewHostBackend());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  std::string Render() { return Serialize(CollectMetrics({store_.get(), &rpcs_, &fd_})); }
  Exposition Scrape() {
    const std::string text = Render();
    absl::StatusOr<Exposition> e = ParseExposition(text);
    EXPECT_TRUE(e.ok()) << e.status() << "\n" << text;
    return e.ok() ? *std::move(e) : Exposition{};
  }
  // Appends n float32 tokens to layer 0 of a SmallSpec cache.
  absl::Status Append(const std::string& id, int64_t pos, int64_t n) {
    std::vector<float> kv(size_t(2 * n * 8), 0.5f);
    TensorArg t{DType::kFloat32, {1, 2, n, 8}, kv.data(), kv.size() * sizeof(float)};
    return store_->Append("", id, 0, pos, t, t).status();
  }
  static PromLabels Call(const std::string& method, const std::string& code) {
    return {{"method", method}, {"code", code}};
  }

  FakeClock clock_;  // before store_, which reads it until it goes
  std::unique_ptr<KvStore> store_;
  RpcMetrics rpcs_;
  FdMetrics fd_;
};

TEST_F(MetricsFormatTest, EveryFamilyIsTypedDocumentedAndNamedByConvention) {
  ASSERT_TRUE(store_->Allocate("", SmallSpec(), "a").ok());
  ASSERT_TRUE(Append("a", 0, 5).ok());
  rpcs_.RecordCall(Rpc::kAppend, absl::OkStatus(), absl::Microseconds(40));
  rpcs_.RecordCall(Rpc::kAllocate, RefusedError(Refusal::kMaxCaches, "no"), absl::Microseconds(9));
  fd_.CountRequest(FdOp::kListRegions, absl::StatusCode::kOk);
  const Exposition e = Scrape();
  ASSERT_GE(e.families.size(), 30u);
  for (const auto& f : e.families) {
    SCOPED_TRACE(f.name);
    EXPECT_THAT(f.name, ::testing::StartsWith("kvarena_"));
    EXPECT_FALSE(f.help.empty());
    EXPECT_EQ(f.help.find_first_of("\\\n"), std::string::npos) << "HELP needs no escaping";
    if (f.type == "counter") {
      EXPECT_THAT(f.name, ::testing::EndsWith("_total"));
    } else if (f.type == "histogram") {
      EXPECT_THAT(f.name, ::testing::EndsWith("_seconds"));
    } else {
      EXPECT_EQ(f.type, "gauge");
      // Two gauges from before this rule keep their names: they count pages in all.
      if (f.name != "kvarena_pages_total" && f.name != "kvarena_pool_pages_total") {
        EXPECT_THAT(f.name, Not(::testing::EndsWith("_total")));
      }
    }
  }
}

TEST_F(MetricsFormatTest, HistogramBucketsHoldEachObservationInItsFirstBound) {
  for (absl::Duration d :
       {absl::Microseconds(5), absl::Microseconds(10),
        absl::Microseconds(10) + absl::Nanoseconds(1), absl::Seconds(3), absl::Seconds(20)}) {
    rpcs_.RecordCall(Rpc::kAppend, absl::OkStatus(), d);
  }
  rpcs_.RecordCall(Rpc::kAppend, absl::NotFoundError("x"), absl::Milliseconds(1));
  const Exposition e = Scrape();
  std::map<double, double> buckets;  // le -> cumulative count
  for (const auto& [labels, value] : e.Series("kvarena_rpc_duration_seconds_bucket")) {
    if (labels.at("method") == "Append" && labels.at("code") == "OK") {
      buckets[std::stod(labels.at("le"))] = value;
    }
  }
  ASSERT_EQ(buckets.size(), kLatencyBoundsNanos.size() + 1);
  EXPECT_EQ(buckets.begin()->first, 10e-6);
  EXPECT_EQ(buckets[10e-6], 2);  // 5 µs and exactly 10 µs
  EXPECT_EQ(buckets[25e-6], 3);  // 10 µs + 1 ns
  EXPECT_EQ(buckets[2.5], 3);
  EXPECT_EQ(buckets[5], 4);  // 3 s
  EXPECT_EQ(buckets[10], 4);
  EXPECT_EQ(buckets.rbegin()->second, 5);  // +Inf: 20 s too
  EXPECT_EQ(e.Value("kvarena_rpc_duration_seconds_count", Call("Append", "OK")), 5);
  EXPECT_NEAR(*e.Value("kvarena_rpc_duration_seconds_sum", Call("Append", "OK")), 23.000025001,
              1e-6);
  EXPECT_EQ(e.Value("kvarena_rpc_total", Call("Append", "OK")), 5);
  EXPECT_EQ(e.Value("kvarena_rpc_duration_seconds_count", Call("Append", "NOT_FOUND")), 1);
  EXPECT_EQ(e.Series("kvarena_rpc_duration_seconds_count").size(), 2u) << "only series seen";
}

TEST_F(MetricsFormatTest, AttachIsCountedByHowItEndedButNotTimed) {
  rpcs_.RecordStreamEnd(Rpc::kAttach, absl::CancelledError("gone"));
  rpcs_.RecordStreamEnd(Rpc::kAttach, RefusedError(Refusal::kMaxSessions, "full"));
  const Exposition e = Scrape();
  EXPECT_EQ(e.Value("kvarena_rpc_total", Call("Attach", "CANCELLED")), 1);
  EXPECT_EQ(e.Value("kvarena_rpc_total", Call("Attach", "RESOURCE_EXHAUSTED")), 1);
  EXPECT_EQ(e.Value("kvarena_resource_exhausted_total",
                    {{"method", "Attach"}, {"reason", "max_sessions"}}),
            1);
  EXPECT_TRUE(e.Series("kvarena_rpc_duration_seconds_count").empty());
}

TEST_F(MetricsFormatTest, RefusalsAreCountedByTheBoundTheyMet) {
  ASSERT_TRUE(store_->Allocate("", SmallSpec(/*max_tokens=*/4), "a").ok());
  rpcs_.RecordCall(Rpc::kAppend, Append("a", 0, 5), absl::Microseconds(30));  // the store's refusal
  rpcs_.RecordCall(Rpc::kReserve, RefusedError(Refusal::kArenaFull, "full"),
                   absl::Microseconds(30));
  rpcs_.RecordCall(Rpc::kAllocate, RefusedError(Refusal::kMaxCaches, "n"), absl::Microseconds(30));
  rpcs_.RecordCall(Rpc::kAllocate, RefusedError(Refusal::kMaxCaches, "n"), absl::Microseconds(30));
  rpcs_.RecordCall(Rpc::kGetKv, absl::ResourceExhaustedError("untagged"), absl::Microseconds(30));
  rpcs_.RecordCall(Rpc::kGetKv, absl::InvalidArgumentError("not a refusal"),
                   absl::Microseconds(30));
  const Exposition e = Scrape();
  EXPECT_EQ(e.Series("kvarena_resource_exhausted_total"),
            (std::map<PromLabels, double>{{{{"method", "Append"}, {"reason", "max_tokens"}}, 1},
                                          {{{"method", "Reserve"}, {"reason", "arena_full"}}, 1},
                                          {{{"method", "Allocate"}, {"reason", "max_caches"}}, 2},
                                          {{{"method", "GetKv"}, {"reason", "other"}}, 1}}));
  EXPECT_EQ(e.Value("kvarena_rpc_total", Call("Allocate", "RESOURCE_EXHAUSTED")), 2);
  EXPECT_EQ(e.Value("kvarena_rpc_total", Call("GetKv", "INVALID_ARGUMENT")), 1);
  EXPECT_EQ(e.Value("kvarena_refusals_total"), 1) << "the store's own count of the refused append";
}

// One pool per geometry: released and allocated again, it has a new id but the same
// series, and nothing on the page names a cache or a session.
TEST_F(MetricsFormatTest, PoolsAreLabelledByGeometryAndNoIdIsALabel) {
  const std::string session = *store_->OpenSession("worker");
  ASSERT_TRUE(store_->Allocate("", SmallSpec(), "cache-id-one").ok());
  ASSERT_TRUE(store_->Release("", "cache-id-one").ok());
  ASSERT_TRUE(store_->Allocate("", SmallSpec(), "cache-id-two").ok());
  ASSERT_TRUE(Append("cache-id-two", 0, 9).ok());  // 3 pages of 4 tokens
  const std::string text = Render();
  EXPECT_THAT(text, Not(HasSubstr("cache-id")));
  EXPECT_THAT(text, Not(HasSubstr(session)));
  const Exposition e = Scrape();
  const PromLabels geometry = {{"dtype", "float32"},
                               {"kv_format", "float32"},
                               {"num_kv_heads", "2"},
                               {"head_dim", "8"},
                               {"page_size", "4"}};
  const uint64_t page_bytes = 2 * 4 * 2 * 8 * 4;
  EXPECT_EQ(e.Series("kvarena_pool_pages_used"), (std::map<PromLabels, double>{{geometry, 3}}));
  EXPECT_EQ(e.Value("kvarena_pool_page_bytes", geometry), page_bytes);
  EXPECT_EQ(e.Value("kvarena_pool_bytes_used", geometry), 3 * page_bytes);
  EXPECT_EQ(e.Value("kvarena_pool_caches", geometry), 1);
  EXPECT_EQ(e.Value("kvarena_pool_pages_total", geometry),
            *e.Value("kvarena_pool_pages_used", geometry) +
                *e.Value("kvarena_pool_pages_free", geometry));
  EXPECT_EQ(e.Value("kvarena_pages_used"), 3);
  EXPECT_EQ(e.Value("kvarena_bytes_used"), 3 * page_bytes);
}

TEST_F(MetricsFormatTest, SessionsCountOpensDetachesAndReaps) {
  const std::string a = *store_->OpenSession("a");
  ASSERT_TRUE(store_->OpenSession("b").ok());
  ASSERT_TRUE(store_->Allocate(a, SmallSpec(), "owned").ok());
  store_->DetachSession(a, absl::Seconds(5));
  Exposition e = Scrape();
  EXPECT_EQ(e.Value("kvarena_sessions"), 2);
  EXPECT_EQ(e.Value("kvarena_sessions_attached"), 1);
  EXPECT_EQ(e.Value("kvarena_sessions_in_grace"), 1);
  EXPECT_EQ(e.Value("kvarena_sessions_opened_total"), 2);
  EXPECT_EQ(e.Value("kvarena_sessions_detached_total"), 1);
  EXPECT_EQ(e.Value("kvarena_sessions_reaped_total"), 0);
  clock_.Advance(absl::Seconds(5));
  ASSERT_EQ(store_->Reap(), 1);
  e = Scrape();
  EXPECT_EQ(e.Value("kvarena_sessions"), 1);
  EXPECT_EQ(e.Value("kvarena_sessions_in_grace"), 0);
  EXPECT_EQ(e.Value("kvarena_sessions_reaped_total"), 1);
  EXPECT_EQ(e.Value("kvarena_caches_reaped_total", {{"reason", "session_grace"}}), 1);
  EXPECT_EQ(e.Value("kvarena_caches_reaped_total", {{"reason", "idle_ttl"}}), 0);
}

TEST_F(MetricsFormatTest, FdSocketFamiliesCountRequestsExportsAndConnections) {
  fd_.CountRequest(FdOp::kListRegions, absl::StatusCode::kOk);
  fd_.CountRequest(FdOp::kExportRegion, absl::StatusCode::kOk);
  fd_.CountRequest(FdOp::kExportRegion, absl::StatusCode::kOk);
  fd_.CountRequest(FdOp::kNone, absl::StatusCode::kPermissionDenied);
  fd_.CountExport(3, 6 << 20);
  fd_.CountExport(1, 2 << 20);
  fd_.ConnectionOpened();
  fd_.ConnectionOpened();
  fd_.ConnectionClosed();
  fd_.ConnectionRefused();
  const Exposition e = Scrape();
  EXPECT_EQ(e.Series("kvarena_fd_requests_total"),
            (std::map<PromLabels, double>{{{{"op", "list_regions"}, {"code", "OK"}}, 1},
                                          {{{"op", "export_region"}, {"code", "OK"}}, 2},
                                          {{{"op", "none"}, {"code", "PERMISSION_DENIED"}}, 1}}));
  EXPECT_EQ(e.Value("kvarena_fd_exported_fds_total"), 4);
  EXPECT_EQ(e.Value("kvarena_fd_exported_bytes_total"), 8 << 20);
  EXPECT_EQ(e.Value("kvarena_fd_connections"), 1);
  EXPECT_EQ(e.Value("kvarena_fd_connections_refused_total"), 1);
}

// prometheus-cpp escapes what label values may hold; the reader undoes exactly that.
TEST(PrometheusTextTest, LabelValuesAreEscapedAndReadBack) {
  prometheus::MetricFamily f;
  f.name = "kvarena_test";
  f.help = "A test family.";
  f.type = prometheus::MetricType::Gauge;
  prometheus::ClientMetric m;
  const std::string awkward = "quote\" backslash\\ newline\n end";
  m.label = {{"value", awkward}};
  m.gauge.value = 2;
  f.metric.push_back(m);
  const std::string text = Serialize({f});
  EXPECT_THAT(text, HasSubstr(R"(kvarena_test{value="quote\" backslash\\ newline\n end"} 2)"));
  absl::StatusOr<Exposition> e = ParseExposition(text);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->Value("kvarena_test", {{"value", awkward}}), 2);
}

TEST(PrometheusTextTest, RejectsWhatAScraperWould) {
  const std::string typed = "# TYPE h histogram\n";
  const struct {
    const char* why;
    std::string text;
  } kBad[] = {
      {"no TYPE", "x 1\n"},
      {"TYPE after samples", "# TYPE x gauge\nx 1\n# TYPE x gauge\n"},
      {"unknown type", "# TYPE x meter\nx 1\n"},
      {"bad escape", "# TYPE x gauge\nx{a=\"\\t\"} 1\n"},
      {"unterminated value", "# TYPE x gauge\nx{a=\"b} 1\n"},
      {"label twice", "# TYPE x gauge\nx{a=\"1\",a=\"2\"} 1\n"},
      {"not a number", "# TYPE x gauge\nx one\n"},
      {"no final line feed", "# TYPE x gauge\nx 1"},
      {"series twice", "# TYPE x gauge\nx 1\nx 2\n"},
      {"families interleaved", "# TYPE x gauge\n# TYPE y gauge\nx{a=\"1\"} 1\ny 1\nx{a=\"2\"} 1\n"},
      {"negative counter", "# TYPE x_total counter\nx_total -1\n"},
      {"bare histogram sample", typed + "h 1\n"},
      {"no +Inf", typed + "h_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n"},
      {"+Inf != count",
       typed + "h_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 2\n"},
      {"count falls",
       typed + "h_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"},
      {"le falls", typed + "h_bucket{le=\"2\"} 1\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\n"
                           "h_sum 1\nh_count 1\n"},
      {"no _sum", typed + "h_bucket{le=\"+Inf\"} 1\nh_count 1\n"},
  };
  for (const auto& c : kBad) {
    SCOPED_TRACE(c.why);
    EXPECT_FALSE(ParseExposition(c.text).ok()) << c.text;
  }
  EXPECT_TRUE(ParseExposition(typed + "h_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\n"
                                      "h_count 2\n# a comment\n\n")
                  .ok());
}

}  // namespace
}  // namespace kvarena
