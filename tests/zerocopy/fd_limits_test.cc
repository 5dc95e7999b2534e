// The fd socket's bounds through a real kvarenad: connections beyond --max_fd_connections
// are closed while everyone admitted is still served; idle connections close after
// --fd_idle_timeout and a RegionClient reconnects past it; a peer that stalls mid-request
// or leaves its replies unread is cut off; accept backs off when the daemon runs out of
// fds and serves again once it has some; bounds out of range stop it at start; it runs
// with RLIMIT_NOFILE's soft limit raised to the hard one.
//
// Waits for the daemon to act are bounded generously (kBound) as a failure guard; no
// test asserts how long anything took.
#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "arena/fd_passing.h"
#include "base/status_macros.h"
#include "client/region_client.h"
#include "gtest/gtest.h"
#include "kvarena/v1/kvarena.grpc.pb.h"
#include "kvarena/v1/kvarena.pb.h"
#include "tests/daemon/daemon_process.h"

namespace kvarena {
namespace {

constexpr absl::Duration kBound = absl::Seconds(20);

class FdLimitsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (int sock : socks_) close(sock);
    for (auto& ctx : attach_contexts_) ctx->TryCancel();
  }
  void Start(std::vector<std::string> flags) {
    daemon_ = std::make_unique<DaemonProcess>(std::move(flags));
    ASSERT_TRUE(daemon_->WaitServing()) << daemon_->Log();
    stub_ = v1::KvCacheService::NewStub(daemon_->NewChannel());
  }
  std::string fd_socket() const { return daemon_->socket_path() + ".fds"; }

  // Opens an Attach stream held until the test ends; returns the session id.
  std::string Attach() {
    attach_contexts_.push_back(std::make_unique<grpc::ClientContext>());
    v1::AttachRequest req;
    req.set_client_name("fd-limits-test");
    attach_streams_.push_back(stub_->Attach(attach_contexts_.back().get(), req));
    v1::AttachEvent first;
    EXPECT_TRUE(attach_streams_.back()->Read(&first));
    return first.session_id();
  }
  // Allocates a cache of head_dim (a new geometry makes a new pool); returns its pool id.
  uint64_t AllocatePool(const std::string& session, int head_dim) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("kvarena-session", session);
    v1::AllocateRequest req;
    req.mutable_spec()->set_num_layers(1);
    req.mutable_spec()->set_num_kv_heads(2);
    req.mutable_spec()->set_head_dim(head_dim);
    req.mutable_spec()->set_dtype(v1::FLOAT32);
    v1::AllocateResponse resp;
    EXPECT_TRUE(stub_->Allocate(&ctx, req, &resp).ok());
    return resp.cache().pool_id();
  }

  // A raw connection to the fd socket, closed at teardown; its reads give up after kBound.
  int Connect() {
    absl::StatusOr<int> sock = ConnectUnix(fd_socket());
    EXPECT_TRUE(sock.ok()) << sock.status();
    if (!sock.ok()) return -1;
    const timeval tv = absl::ToTimeval(kBound);
    setsockopt(*sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    socks_.push_back(*sock);
    return *sock;
  }
  static std::string ListRegionsRequest(const std::string& session) {
    v1::FdRequest req;
    req.set_session_id(session);
    req.mutable_list_regions();
    return req.SerializeAsString();
  }
  // True when the daemon answers a ListRegions on sock (with OK).
  static bool Served(int sock, const std::string& session) {
    absl::StatusOr<v1::FdReply> reply = Answer(sock, session);
    return reply.ok() && reply->code() == 0;
  }
  // The daemon's reply to a ListRegions on sock, whatever its code.
  static absl::StatusOr<v1::FdReply> Answer(int sock, const std::string& session) {
    if (absl::Status s = SendMessage(sock, ListRegionsRequest(session)); !s.ok()) return s;
    KVARENA_ASSIGN_OR_RETURN(Message m, RecvMessage(sock));
    for (int fd : m.fds) close(fd);
    v1::FdReply reply;
    if (!reply.ParseFromString(m.bytes)) return absl::InternalError("reply does not parse");
    return reply;
  }
  // True once the daemon has closed its end of sock (within kBound). Reads nothing, so
  // replies the test left unread stay unread.
  static bool ClosedByDaemon(int sock) {
    const absl::Time deadline = absl::Now() + kBound;
    while (absl::Now() < deadline) {
      pollfd p = {sock, POLLRDHUP, 0};
      if (poll(&p, 1, 100) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) return true;
    }
    return false;
  }
  // Waits (within kBound) for the daemon's log to contain `text`.
  bool LogShows(const std::string& text) const {
    const absl::Time deadline = absl::Now() + kBound;
    while (daemon_->Log().find(text) == std::string::npos) {
      if (absl::Now() >= deadline) return false;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return true;
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<v1::KvCacheService::Stub> stub_;
  std::vector<std::unique_ptr<grpc::ClientContext>> attach_contexts_;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::AttachEvent>>> attach_streams_;
  std::vector<int> socks_;
};

TEST_F(FdLimitsTest, ConnectionsBeyondTheBoundAreClosedAndTheAdmittedStillServed) {
  Start({"--max_fd_connections=3"});
  const std::string s = Attach();
  auto worker = RegionClient::Connect(fd_socket(), s);  // connection 1
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE((*worker)->GetScratch().ok());
  const int second = Connect(), third = Connect();
  ASSERT_TRUE(Served(second, s));
  ASSERT_TRUE(Served(third, s));
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    const int extra = Connect();
    EXPECT_TRUE(ClosedByDaemon(extra));
    EXPECT_FALSE(Served(extra, s));
  }
  // The attached worker still fetches fds, here those of a pool that appears now.
  const uint64_t pool = AllocatePool(s, 8);
  EXPECT_TRUE((*worker)->GetPool(pool).ok());
  EXPECT_TRUE(Served(second, s));
  // A connection that leaves makes room for a new one.
  close(third);
  std::erase(socks_, third);
  bool admitted = false;
  const absl::Time deadline = absl::Now() + kBound;
  while (!admitted && absl::Now() < deadline) {
    admitted = Served(Connect(), s);
    if (!admitted) absl::SleepFor(absl::Milliseconds(10));  // the daemon has yet to see it leave
  }
  EXPECT_TRUE(admitted);
  EXPECT_FALSE(daemon_->WaitExit(absl::ZeroDuration()).has_value()) << daemon_->Log();
}

TEST_F(FdLimitsTest, IdleConnectionsAreClosed) {
  Start({"--fd_idle_timeout=200ms"});
  const std::string s = Attach();
  const int silent = Connect();  // never sends a request
  const int used = Connect();
  ASSERT_TRUE(Served(used, s));
  EXPECT_TRUE(ClosedByDaemon(silent));
  EXPECT_TRUE(ClosedByDaemon(used));
  EXPECT_TRUE(Served(Connect(), s));
}

TEST_F(FdLimitsTest, RegionClientIdlePastTheTimeoutMapsANewPool) {
  Start({"--fd_idle_timeout=200ms"});
  const std::string s = Attach();
  auto worker = RegionClient::Connect(fd_socket(), s);
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE((*worker)->GetScratch().ok());
  // A connection opened after the worker's last exchange: once the daemon closed it for
  // idling, the worker's connection, idle for longer, is closed too.
  ASSERT_TRUE(ClosedByDaemon(Connect()));
  const uint64_t pool = AllocatePool(s, 16);
  auto mapped = (*worker)->GetPool(pool);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_NE(mapped->base, nullptr);
}

TEST_F(FdLimitsTest, PeerStallingMidRequestIsCutOffBeforeItIdlesOut) {
  Start({"--fd_idle_timeout=1h"});
  const int sock = Connect();
  const uint32_t len = 100;  // announces 100 bytes, sends 10
  std::string frame(reinterpret_cast<const char*>(&len), sizeof(len));
  frame.append(10, '\0');
  ASSERT_EQ(send(sock, frame.data(), frame.size(), MSG_NOSIGNAL), ssize_t(frame.size()));
  EXPECT_TRUE(ClosedByDaemon(sock));
  EXPECT_TRUE(Served(Connect(), Attach()));
}

// --fd_request_timeout bounds a whole request, however the peer paces it: one byte every
// 100 ms keeps the connection busy, yet it is closed while the bytes still trickle (the
// 5 s default would let all 30 of them through first).
TEST_F(FdLimitsTest, FdRequestTimeoutBoundsATricklingRequest) {
  Start({"--fd_idle_timeout=1h", "--fd_request_timeout=200ms"});
  const int sock = Connect();
  const uint32_t len = 100000;  // announced, never sent whole
  const std::string header(reinterpret_cast<const char*>(&len), sizeof(len));
  bool closed = false;
  for (size_t i = 0; i < 30 && !closed; ++i) {
    const char byte = i < header.size() ? header[i] : '\0';
    closed = send(sock, &byte, 1, MSG_NOSIGNAL) != 1;
    pollfd p = {sock, POLLRDHUP, 0};
    closed = closed || (poll(&p, 1, 100) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0);
  }
  EXPECT_TRUE(closed);
  EXPECT_TRUE(Served(Connect(), Attach()));
}

TEST_F(FdLimitsTest, PeerLeavingItsRepliesUnreadIsCutOff) {
  Start({"--fd_idle_timeout=1h"});
  const int sock = Connect();
  const std::string request = ListRegionsRequest("");
  const uint32_t len = uint32_t(request.size());
  const std::string frame = std::string(reinterpret_cast<const char*>(&len), sizeof(len)) + request;
  // Requests whenever there is room, no reply read: the replies pile up until the daemon
  // blocks sending one, and then it must give up on this peer.
  bool closed = false;
  const absl::Time deadline = absl::Now() + kBound;
  while (!closed && absl::Now() < deadline) {
    pollfd p = {sock, POLLOUT | POLLRDHUP, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    closed = (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    if (!closed) (void)send(sock, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  EXPECT_TRUE(closed);
  EXPECT_TRUE(Served(Connect(), Attach()));
}

// The daemon's fd numbers in use, from /proc.
int OpenFds(pid_t pid) {
  int n = 0;
  DIR* dir = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  while (dir != nullptr && readdir(dir) != nullptr) ++n;
  if (dir != nullptr) closedir(dir);
  return n - 2;  // . and ..
}

TEST_F(FdLimitsTest, AcceptBacksOffWhileTheDaemonIsOutOfFdsAndServesAfter) {
  Start({});
  const std::string s = Attach();
  rlimit before{};
  ASSERT_EQ(prlimit(daemon_->pid(), RLIMIT_NOFILE, nullptr, &before), 0);
  rlimit tight = before;
  tight.rlim_cur = rlim_t(OpenFds(daemon_->pid()));
  ASSERT_EQ(prlimit(daemon_->pid(), RLIMIT_NOFILE, &tight, nullptr), 0);
  // The first few fill whatever fd numbers are free below the limit; the rest wait.
  std::vector<int> waiting;
  for (int i = 0; i < 32; ++i) waiting.push_back(Connect());
  const bool backed_off = LogShows("accept: Too many open files; retrying every 100ms");
  ASSERT_EQ(prlimit(daemon_->pid(), RLIMIT_NOFILE, &before, nullptr), 0);
  EXPECT_TRUE(backed_off) << daemon_->Log();
  // Every queued connection is answered once fds are back. (Only that: while the daemon
  // had none, gRPC itself may have failed the Attach stream, so the session may be gone:
  // gRPC 1.51 does not recover everything from EMFILE, see docs/operator.md, "Bounds".)
  for (int sock : waiting) EXPECT_TRUE(Answer(sock, s).ok());
}

TEST_F(FdLimitsTest, BoundsOutOfRangeStopTheDaemonAtStart) {
  for (const auto& [flag, says] : std::vector<std::pair<std::string, std::string>>{
           {"--max_fd_connections=0", "--max_fd_connections=0 must be at least 1"},
           {"--fd_idle_timeout=0", "--fd_idle_timeout=0 must be positive"},
           {"--fd_request_timeout=0", "--fd_request_timeout=0 must be positive"},
           {"--watcher_max_backlog=0", "--watcher_max_backlog=0 must be at least 1"}}) {
    SCOPED_TRACE(flag);
    DaemonProcess d({flag});
    const std::optional<int> status = d.WaitExit(kBound);
    ASSERT_TRUE(status.has_value()) << d.Log();
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << *status;
    EXPECT_NE(d.Log().find(says), std::string::npos) << d.Log();
  }
}

TEST_F(FdLimitsTest, SoftOpenFileLimitIsRaisedToTheHardLimit) {
  rlimit ours{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &ours), 0);
  rlimit low = ours;
  low.rlim_cur = std::min<rlim_t>(ours.rlim_max, 256);  // what the daemon inherits
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{});
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &ours), 0);
  ASSERT_TRUE(daemon_->WaitServing()) << daemon_->Log();
  std::ifstream limits("/proc/" + std::to_string(daemon_->pid()) + "/limits");
  std::string line, soft, hard;
  while (std::getline(limits, line)) {
    if (line.rfind("Max open files", 0) == 0) std::istringstream(line.substr(14)) >> soft >> hard;
  }
  ASSERT_FALSE(soft.empty()) << "no open-file limit in /proc/" << daemon_->pid() << "/limits";
  EXPECT_EQ(soft, hard);
  EXPECT_NE(daemon_->Log().find("RLIMIT_NOFILE"), std::string::npos) << daemon_->Log();
}

}  // namespace
}  // namespace kvarena
