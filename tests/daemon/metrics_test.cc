// The Prometheus endpoint: a plain HTTP scrape sees page counters move; it binds
// --metrics_address (loopback by default), as /proc/net/tcp shows.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;

// GET http://127.0.0.1:port/metrics with a bare socket; returns the body ("" on failure).
std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (write(fd, req.data(), req.size()) == ssize_t(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) response.append(buf, size_t(n));
    }
  }
  close(fd);
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
  EXPECT_THAT(after, HasSubstr("kvarena_pool_pages_used{pool_id=\"0\",dtype=\"float32\","
                               "num_kv_heads=\"1\",head_dim=\"4\",page_size=\"4\"} 3"));
  EXPECT_THAT(after, HasSubstr("kvarena_rpc_total{method=\"Append\",code=\"OK\"} 1"));
}

TEST_F(MetricsTest, RpcCounterSeparatesStatusCodes) {
  ASSERT_THAT(AppendF32("missing", 0, 0, 1, 1, 4, 1), StatusIs(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(Scrape(port_), HasSubstr("kvarena_rpc_total{method=\"Append\",code=\"NOT_FOUND\"} 1"));
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

}  // namespace
}  // namespace kvarena
