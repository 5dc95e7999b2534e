// The Prometheus endpoint of a real kvarenad: plain HTTP scrapes, read by a strict
// format-0.0.4 reader, move exactly as the traffic between them did (calls by method
// and code, latency histograms, refusals by reason, pages, sessions reaped, fd-socket
// exports); it binds --metrics_address (loopback by default), as /proc/net/tcp shows.
// Waits are for events (a scrape showing the reap), bounded only as a failure guard.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include "absl/time/clock.h"
#include "arena/fd_passing.h"
#include "tests/daemon/prometheus_text.h"
#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using ::kvarena::testing::Exposition;
using ::kvarena::testing::ParseExposition;
using ::kvarena::testing::PromLabels;
using ::testing::HasSubstr;

// The body of a scrape ("" on failure).
std::string Scrape(int port) {
  const std::string response = GetMetrics(port);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The value of an unlabelled sample, -1 when absent.
double Sample(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

// The local address of the IPv4 socket listening on `port`, as /proc/net/tcp writes it
// (hex in network order read as a little-endian word: "0100007F" is 127.0.0.1); "" if none.
std::string ListeningAddress(int port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // the header
  char want[8];
  std::snprintf(want, sizeof(want), ":%04X", port);
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    if (state == "0A" && local.size() > 5 && local.substr(local.size() - 5) == want) {
      return local.substr(0, local.size() - 5);
    }
  }
  return "";
}

// An IPv4 address of this machine other than loopback, if it has one.
std::optional<in_addr> NonLoopbackAddress() {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return std::nullopt;
  std::optional<in_addr> found;
  for (ifaddrs* a = all; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    const in_addr addr = reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr;
    if ((ntohl(addr.s_addr) >> 24) != 127) found = addr;
  }
  freeifaddrs(all);
  return found;
}

bool Connects(in_addr addr, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr = addr;
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
  close(fd);
  return ok;
}

class MetricsTest : public KvarenadTest {
 protected:
  void SetUp() override {
    port_ = PickUnusedPort();
    StartDaemon({"--arena_bytes=16Mi", "--metrics_port=" + std::to_string(port_)});
  }
  int port_ = 0;
};

TEST_F(MetricsTest, PagesUsedFollowsAppends) {
  const std::string before = Scrape(port_);
  ASSERT_THAT(before, HasSubstr("# TYPE kvarena_pages_used gauge"));
  EXPECT_EQ(Sample(before, "kvarena_pages_used"), 0);
  EXPECT_EQ(Sample(before, "kvarena_arena_bytes"), 16 << 20);

  const std::string id = Allocate(Spec(1, 1, 4));
  ASSERT_TRUE(AppendF32(id, 0, 0, 9, 1, 4, 1).ok());
  const std::string after = Scrape(port_);
  EXPECT_EQ(Sample(after, "kvarena_pages_used"), 3);
  EXPECT_EQ(Sample(after, "kvarena_caches"), 1);
  EXPECT_THAT(after, HasSubstr("kvarena_pool_pages_used{dtype=\"float32\",kv_format=\"float32\","
                               "num_kv_heads=\"1\",head_dim=\"4\",page_size=\"4\"} 3"));
  EXPECT_THAT(after, HasSubstr("kvarena_rpc_total{method=\"Append\",code=\"OK\"} 1"));
}

TEST_F(MetricsTest, RpcCounterSeparatesStatusCodes) {
  ASSERT_THAT(AppendF32("missing", 0, 0, 1, 1, 4, 1), StatusIs(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(Scrape(port_),
              HasSubstr("kvarena_rpc_total{method=\"Append\",code=\"NOT_FOUND\"} 1"));
}

TEST_F(MetricsTest, BindsLoopbackByDefault) {
  EXPECT_THAT(daemon_->Log(), HasSubstr("metrics=127.0.0.1:" + std::to_string(port_) + " "));
  EXPECT_EQ(ListeningAddress(port_), "0100007F");
  if (const std::optional<in_addr> other = NonLoopbackAddress()) {
    EXPECT_FALSE(Connects(*other, port_)) << "metrics answered on a non-loopback address";
  }
}

TEST_F(MetricsTest, MetricsAddressPicksTheInterface) {
  daemon_.reset();  // frees port_
  StartDaemon({"--metrics_address=0.0.0.0", "--metrics_port=" + std::to_string(port_)});
  EXPECT_EQ(ListeningAddress(port_), "00000000");
  EXPECT_THAT(Scrape(port_), HasSubstr("kvarena_pages_used"));
}

TEST_F(MetricsTest, ServesTheTextFormat) {
  const std::string response = GetMetrics(port_);
  EXPECT_THAT(response, HasSubstr("200 OK"));
  // prometheus-cpp 1.0 says "text/plain; charset=utf-8"; Prometheus reads text/plain
  // without a version as the text format 0.0.4.
  EXPECT_THAT(response, HasSubstr("Content-Type: text/plain"));
  const absl::StatusOr<Exposition> e = ParseExposition(Scrape(port_));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_NE(e->Family("kvarena_rpc_duration_seconds"), nullptr);
}

// Idle connections (more than the exposer has threads) do not hold up a scrape: each is
// given up on after the request timeout. Bounded by the client's 10 s, not timed.
TEST_F(MetricsTest, IdleConnectionsDoNotStallAScrape) {
  std::vector<int> idle;
  for (int i = 0; i < 12; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port_));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    idle.push_back(fd);  // sends nothing
  }
  const std::string response = GetMetrics(port_, /*timeout_s=*/10);
  for (int fd : idle) close(fd);
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr("kvarena_rpc_duration_seconds"));
}

// Every series of `name` that moved between two scrapes, by how much.
std::map<PromLabels, double> Moved(const Exposition& before, const Exposition& after,
                                   const std::string& name) {
  std::map<PromLabels, double> moved = after.Series(name);
  for (const auto& [labels, value] : before.Series(name)) moved[labels] -= value;
  std::erase_if(moved, [](const auto& m) { return m.second == 0; });
  return moved;
}

PromLabels Call(const std::string& method, const std::string& code) {
  return {{"method", method}, {"code", code}};
}

// One fd-socket request on an open connection: the reply, its fds closed and counted.
v1::FdReply FdCall(int sock, const v1::FdRequest& req, size_t* fds) {
  v1::FdReply reply;
  EXPECT_TRUE(SendMessage(sock, req.SerializeAsString()).ok());
  absl::StatusOr<Message> m = RecvMessage(sock);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return reply;
  for (int fd : m->fds) close(fd);
  *fds = m->fds.size();
  EXPECT_TRUE(reply.ParseFromString(m->bytes));
  return reply;
}

// Reaping is quick (--session_grace=0s); two caches at most, so the third is refused.
class MetricsTrafficTest : public KvarenadTest {
 protected:
  void SetUp() override {
    port_ = PickUnusedPort();
    StartDaemon({"--arena_bytes=16Mi", "--metrics_port=" + std::to_string(port_),
                 "--session_grace=0s", "--max_caches=2", "--scratch_bytes=2Mi"});
  }
  Exposition Parse() {
    const std::string text = Scrape(port_);
    absl::StatusOr<Exposition> e = ParseExposition(text);
    EXPECT_TRUE(e.ok()) << e.status() << "\n" << text;
    return e.ok() ? *std::move(e) : Exposition{};
  }
  // Scrapes until done holds; kBound is only a failure guard.
  bool ParseUntil(const std::function<bool(const Exposition&)>& done) {
    for (const absl::Time deadline = absl::Now() + kBound; absl::Now() < deadline;
         absl::SleepFor(absl::Milliseconds(10))) {
      if (done(Parse())) return true;
    }
    return false;
  }
  static constexpr absl::Duration kBound = absl::Seconds(60);
  int port_ = 0;
};

TEST_F(MetricsTrafficTest, ScrapesMoveExactlyAsTheTrafficDid) {
  const Exposition before = Parse();
  ASSERT_EQ(before.Value("kvarena_pages_used"), 0);

  // Without a session: allocate, append 8 tokens (2 pages of 4), attend, an append
  // refused at max_tokens, a release of nothing.
  v1::CacheSpec capped = Spec(1, 2, 8);
  capped.set_max_tokens(8);
  const std::string a = Allocate(capped);
  ASSERT_TRUE(AppendF32(a, 0, 0, 8, 2, 8, 1).ok());
  v1::AttendRequest attend;
  attend.set_cache_id(a);
  attend.set_pos(7);
  *attend.mutable_q() = F32Tensor(2, 1, 8, 3);
  v1::AttendResponse attended;
  ASSERT_TRUE(stub_->Attend(Ctx().get(), attend, &attended).ok());
  EXPECT_THAT(AppendF32(a, 0, 8, 1, 2, 8, 2),
              StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, "max_tokens=8"));
  v1::ReleaseRequest release;
  release.set_cache_id("missing");
  v1::ReleaseResponse released;
  EXPECT_THAT(stub_->Release(Ctx().get(), release, &released),
              StatusIs(grpc::StatusCode::NOT_FOUND));

  // A session with a cache of one page; a Reserve past the arena and a third cache are
  // refused; its pool's fds are fetched from the fd socket.
  grpc::ClientContext* stream = nullptr;
  const std::string session = Attach("metrics-worker", &stream);
  const std::string s = Allocate(Spec(1, 2, 8), session);
  ASSERT_TRUE(AppendF32(s, 0, 0, 4, 2, 8, 4, session).ok());
  v1::ReserveRequest reserve;
  v1::CacheTokens* item = reserve.add_items();
  item->set_cache_id(s);
  item->set_tokens(1'000'000);  // 250,000 pages of 512 bytes
  v1::ReserveResponse reserved;
  EXPECT_THAT(stub_->Reserve(Ctx(session).get(), reserve, &reserved),
              StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, "arena full"));
  v1::AllocateRequest third;
  *third.mutable_spec() = Spec(1, 2, 8);
  v1::AllocateResponse unused;
  EXPECT_THAT(stub_->Allocate(Ctx().get(), third, &unused),
              StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, "max_caches=2"));

  const absl::StatusOr<int> sock = ConnectUnix(daemon_->socket_path() + ".fds");
  ASSERT_TRUE(sock.ok()) << sock.status();
  v1::FdRequest list;
  list.set_session_id(session);
  list.mutable_list_regions();
  size_t fds = 0;
  const v1::FdReply regions = FdCall(*sock, list, &fds);
  ASSERT_EQ(regions.code(), 0) << regions.message();
  uint64_t pool_region = 0;
  for (const v1::RegionDescriptor& r : regions.regions()) {
    if (!r.scratch()) pool_region = r.region_id();
  }
  ASSERT_NE(pool_region, 0u);
  v1::FdRequest export_pool;
  export_pool.set_session_id(session);
  export_pool.mutable_export_region()->set_region_id(pool_region);
  const v1::FdReply exported = FdCall(*sock, export_pool, &fds);
  ASSERT_EQ(exported.code(), 0) << exported.message();
  ASSERT_GT(fds, 0u);
  ASSERT_EQ(size_t(exported.pieces_size()), fds);
  uint64_t exported_bytes = 0;
  for (const v1::RegionPiece& p : exported.pieces()) exported_bytes += p.bytes();

  const Exposition during = Parse();
  const PromLabels geometry = {{"dtype", "float32"},
                               {"kv_format", "float32"},
                               {"num_kv_heads", "2"},
                               {"head_dim", "8"},
                               {"page_size", "4"}};
  EXPECT_EQ(during.Value("kvarena_pages_used"), 3);
  EXPECT_EQ(during.Value("kvarena_pool_pages_used", geometry), 3);
  EXPECT_EQ(during.Value("kvarena_pool_bytes_used", geometry), 3 * 512);
  EXPECT_EQ(during.Value("kvarena_caches"), 2);
  EXPECT_EQ(during.Value("kvarena_sessions_attached"), 1);
  EXPECT_EQ(during.Value("kvarena_fd_connections"), 1);
  close(*sock);

  // The last cache of the session goes when its grace (0 s) ends: the reap is counted
  // once its pages are back, so a scrape after the one that shows it sees them back.
  v1::ReleaseRequest release_a;
  release_a.set_cache_id(a);
  ASSERT_TRUE(stub_->Release(Ctx().get(), release_a, &released).ok());
  stream->TryCancel();
  ASSERT_TRUE(ParseUntil([&](const Exposition& e) {
    return e.ValueOr0("kvarena_sessions_reaped_total") >
               before.ValueOr0("kvarena_sessions_reaped_total") &&
           e.ValueOr0("kvarena_fd_connections") == 0;
  }));
  const Exposition after = Parse();

  const std::map<PromLabels, double> calls = {
      {Call("Allocate", "OK"), 2}, {Call("Allocate", "RESOURCE_EXHAUSTED"), 1},
      {Call("Append", "OK"), 2},   {Call("Append", "RESOURCE_EXHAUSTED"), 1},
      {Call("Attend", "OK"), 1},   {Call("Reserve", "RESOURCE_EXHAUSTED"), 1},
      {Call("Release", "OK"), 1},  {Call("Release", "NOT_FOUND"), 1}};
  std::map<PromLabels, double> with_attach = calls;
  with_attach[Call("Attach", "CANCELLED")] = 1;  // counted when the stream ended, not timed
  EXPECT_EQ(Moved(before, after, "kvarena_rpc_total"), with_attach);
  EXPECT_EQ(Moved(before, after, "kvarena_rpc_duration_seconds_count"), calls);
  for (const auto& [labels, n] : calls) {  // the reader checked the buckets rise to _count
    PromLabels inf = labels;
    inf["le"] = "+Inf";
    EXPECT_EQ(after.Value("kvarena_rpc_duration_seconds_bucket", inf), n);
  }
  EXPECT_EQ(
      Moved(before, after, "kvarena_resource_exhausted_total"),
      (std::map<PromLabels, double>{{{{"method", "Append"}, {"reason", "max_tokens"}}, 1},
                                    {{{"method", "Reserve"}, {"reason", "arena_full"}}, 1},
                                    {{{"method", "Allocate"}, {"reason", "max_caches"}}, 1}}));
  EXPECT_EQ(Moved(before, after, "kvarena_refusals_total"), (std::map<PromLabels, double>{{{}, 2}}))
      << "the store counts the append and the reserve, not the allocate";

  EXPECT_EQ(after.Value("kvarena_pages_used"), 0);
  EXPECT_EQ(after.Value("kvarena_bytes_used"), 0);
  EXPECT_EQ(after.Value("kvarena_caches"), 0);
  // The pool stays for its warm chunks (--arena_warm_bytes), holding no page.
  for (const auto& [labels, value] : after.Series("kvarena_pool_pages_used")) EXPECT_EQ(value, 0);
  EXPECT_EQ(after.Value("kvarena_sessions"), 0);
  EXPECT_EQ(after.Value("kvarena_sessions_attached"), 0);
  EXPECT_EQ(after.Value("kvarena_sessions_in_grace"), 0);
  for (const char* name : {"kvarena_sessions_opened_total", "kvarena_sessions_detached_total",
                           "kvarena_sessions_reaped_total"}) {
    EXPECT_EQ(Moved(before, after, name), (std::map<PromLabels, double>{{{}, 1}})) << name;
  }
  EXPECT_EQ(Moved(before, after, "kvarena_caches_reaped_total"),
            (std::map<PromLabels, double>{{{{"reason", "session_grace"}}, 1}}));

  EXPECT_EQ(Moved(before, after, "kvarena_fd_requests_total"),
            (std::map<PromLabels, double>{{{{"op", "list_regions"}, {"code", "OK"}}, 1},
                                          {{{"op", "export_region"}, {"code", "OK"}}, 1}}));
  EXPECT_EQ(Moved(before, after, "kvarena_fd_exported_fds_total"),
            (std::map<PromLabels, double>{{{}, double(fds)}}));
  EXPECT_EQ(Moved(before, after, "kvarena_fd_exported_bytes_total"),
            (std::map<PromLabels, double>{{{}, double(exported_bytes)}}));
  EXPECT_EQ(after.Value("kvarena_fd_connections"), 0);
}

}  // namespace
}  // namespace kvarena
