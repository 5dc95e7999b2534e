// The fd socket end to end in one process (plus a forked child for the credential check):
// a KvStore, the daemon's FdServer and a worker's RegionClient; the accept loop's answers
// to failing accept4 calls (injected); a RegionClient whose connection the server closed.
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "arena/fd_passing.h"
#include "client/region_client.h"
#include "core/kv_store.h"
#include "daemon/fd_requests.h"
#include "daemon/fd_server.h"
#include "gtest/gtest.h"
#include "kvarena/v1/kvarena.pb.h"

namespace kvarena {
namespace {

class FdSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kvarena-fd-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    StoreOptions o;
    o.arena_bytes = size_t{64} << 20;
    o.num_threads = 0;
    store_ = *KvStore::Create(o, NewHostBackend());
    Restart({});
  }
  void Restart(FdServerOptions options) {
    server_.reset();
    auto server =
        FdServer::Start((dir_ / "kvarena.sock.fds").string(), store_.get(), std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  // An accept that fails with `errors` in turn (counting every call), then accepts.
  std::function<int(int)> FailingAccept(std::vector<int> errors) {
    return [this, errors](int listen_fd) {
      accept_tid_.store(pid_t(syscall(SYS_gettid)));
      const size_t call = size_t(accept_calls_.fetch_add(1));
      if (call < errors.size()) {
        errno = errors[call];
        return -1;
      }
      return accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    };
  }
  // True once the server answered a ListRegions on a new connection.
  bool Served() {
    v1::FdRequest req;
    req.set_session_id(*store_->OpenSession("probe"));
    req.mutable_list_regions();
    return RawCode(req) == 0;
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::unique_ptr<RegionClient> Connect(const std::string& session) {
    auto c = RegionClient::Connect(server_->path(), session);
    EXPECT_TRUE(c.ok()) << c.status();
    return *std::move(c);
  }
  // Sends one raw request and returns the reply's code.
  int RawCode(const v1::FdRequest& req) {
    const int sock = *ConnectUnix(server_->path());
    EXPECT_TRUE(SendMessage(sock, req.SerializeAsString()).ok());
    auto m = RecvMessage(sock);
    close(sock);
    if (!m.ok()) return -1;
    for (int fd : m->fds) close(fd);
    v1::FdReply r;
    r.ParseFromString(m->bytes);
    return r.code();
  }

  std::filesystem::path dir_;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<FdServer> server_;
  std::atomic<int> accept_calls_{0};
  std::atomic<pid_t> accept_tid_{0};  // the thread that called accept last
};

TEST_F(FdSocketTest, WorkerSeesPoolPagesThroughItsMapping) {
  const std::string s = *store_->OpenSession("w");
  CacheSpec spec{1, 2, 8, DType::kFloat32, 4, {}, 0, ""};
  auto info = store_->Allocate(s, spec, "a");
  ASSERT_TRUE(info.ok());
  std::vector<float> k(2 * 5 * 8), v(2 * 5 * 8);
  for (size_t i = 0; i < k.size(); ++i) k[i] = float(i), v[i] = -float(i);
  TensorArg kt{DType::kFloat32, {1, 2, 5, 8}, k.data(), k.size() * 4};
  TensorArg vt{DType::kFloat32, {1, 2, 5, 8}, v.data(), v.size() * 4};
  ASSERT_TRUE(store_->Append(s, "a", 0, 0, kt, vt).ok());

  std::unique_ptr<RegionClient> client = Connect(s);
  auto base = client->PoolBase(info->pool_id);
  ASSERT_TRUE(base.ok()) << base.status();
  const CacheDescription d = *store_->Describe(s, "a");
  PagedKvView view;
  view.layout = PageLayout{DType::kFloat32, 4, 2, 8};
  view.pool_base = *base;
  view.block_table = d.layers[0].page_ids.data();
  view.num_blocks = int64_t(d.layers[0].page_ids.size());
  view.len = 5;
  float got;
  std::memcpy(&got, view.TokenPtr(1, 4) + (1 * 8 + 2) * 4, 4);  // V, token 4, head 1, dim 2
  EXPECT_EQ(got, v[(1 * 5 + 4) * 8 + 2]);
}

// A pool goes with its last cache; a worker that mapped it drops the mapping at its next
// refresh, so dead pools do not pile up in a long-lived worker's address space.
TEST_F(FdSocketTest, AWorkerUnmapsPoolsTheDaemonDestroyed) {
  const std::string s = *store_->OpenSession("w");
  auto first = store_->Allocate(s, CacheSpec{1, 2, 8, DType::kFloat32, 4, {}, 0, ""}, "a");
  ASSERT_TRUE(first.ok());
  std::unique_ptr<RegionClient> client = Connect(s);
  ASSERT_TRUE(client->GetPool(first->pool_id).ok());
  ASSERT_TRUE(store_->Release(s, "a").ok());  // the pool goes with it
  auto second = store_->Allocate(s, CacheSpec{1, 2, 16, DType::kFloat32, 4, {}, 0, ""}, "b");
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(client->GetPool(second->pool_id).ok());
  EXPECT_EQ(client->TEST_MappedPools(), 1u);
  EXPECT_EQ(client->GetPool(first->pool_id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(client->SyncPools().ok());
}

TEST_F(FdSocketTest, ScratchWritesReachTheStore) {
  const std::string s = *store_->OpenSession("w");
  std::unique_ptr<RegionClient> client = Connect(s);
  auto scratch = client->GetScratch();
  ASSERT_TRUE(scratch.ok()) << scratch.status();
  std::memcpy(scratch->base + 1000, "kvarena", 7);
  auto slice = store_->ResolveSlice(s, scratch->region_id, 1000, 7);
  ASSERT_TRUE(slice.ok());
  EXPECT_EQ(std::memcmp(slice->data, "kvarena", 7), 0);
}

TEST_F(FdSocketTest, AnotherSessionCannotObtainTheScratchFds) {
  const std::string s1 = *store_->OpenSession("w1");
  const std::string s2 = *store_->OpenSession("w2");
  const uint64_t scratch1 = Connect(s1)->GetScratch()->region_id;
  v1::FdRequest req;
  req.set_session_id(s2);
  req.mutable_export_region()->set_region_id(scratch1);
  EXPECT_EQ(RawCode(req), int(absl::StatusCode::kPermissionDenied));
  req.set_session_id("0123456789abcdef0123456789abcdef");
  EXPECT_EQ(RawCode(req), int(absl::StatusCode::kFailedPrecondition));
  req.set_session_id("");
  EXPECT_EQ(RawCode(req), int(absl::StatusCode::kFailedPrecondition));
}

TEST_F(FdSocketTest, PeersOfAnotherUserAreRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  const std::string s = *store_->OpenSession("w");
  // Exit code of a child that asks for the session's regions as user nobody (or, without
  // `ask`, connects and only reads, for up to 10 s): 4 = could not connect (the socket's
  // 0660 mode), 3 = refused by SO_PEERCRED, 1 = served or no answer.
  auto ask_as_nobody = [&](bool ask = true) {
    const pid_t child = fork();
    if (child == 0) {
      if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
      v1::FdRequest req;
      req.set_session_id(s);
      req.mutable_list_regions();
      auto sock = ConnectUnix(server_->path());
      if (!sock.ok()) _exit(4);
      // Refused at accept, the peer may find the socket closed before it sends; the
      // refusal is there to read either way.
      const bool sent = ask && SendMessage(*sock, req.SerializeAsString()).ok();
      const absl::Time deadline = !ask   ? absl::Now() + absl::Seconds(10)
                                  : sent ? absl::InfiniteFuture()
                                         : absl::InfinitePast();
      auto m = RecvMessage(*sock, deadline);
      v1::FdReply r;
      if (m.ok()) r.ParseFromString(m->bytes);
      _exit(m.ok() && r.code() == int(absl::StatusCode::kPermissionDenied) && m->fds.empty() ? 3
                                                                                             : 1);
    }
    int status = 0;
    EXPECT_EQ(waitpid(child, &status, 0), child);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  EXPECT_EQ(ask_as_nobody(), 4);
  // Even with the file mode opened up, the credential check refuses the other user.
  ASSERT_EQ(chmod(server_->path().c_str(), 0666), 0);
  EXPECT_EQ(ask_as_nobody(), 3);
  // The check comes at accept, before anything is read: a peer that sends nothing is
  // refused too, instead of holding a connection until the idle timeout.
  EXPECT_EQ(ask_as_nobody(/*ask=*/false), 3);
}

// A request trickled one byte at a time, each well within any per-read timeout, is cut
// off at the request deadline; other peers are served meanwhile.
TEST_F(FdSocketTest, ATrickledRequestIsCutOffAtItsDeadline) {
  FdServerOptions o;
  o.request_timeout = absl::Seconds(1);
  Restart(std::move(o));
  const int sock = *ConnectUnix(server_->path());
  const uint32_t len = 1000;  // announces 1000 bytes; at one per 300 ms, 5 minutes' worth
  ASSERT_EQ(send(sock, &len, sizeof(len), MSG_NOSIGNAL), ssize_t(sizeof(len)));
  bool closed = false;
  for (int i = 0; i < 40 && !closed; ++i) {
    pollfd p = {sock, POLLIN, 0};
    if (poll(&p, 1, 300) > 0) {  // readable: no reply is due, so only the end of the stream
      char c;
      const ssize_t r = recv(sock, &c, 1, 0);
      EXPECT_TRUE(r == 0 || (r < 0 && errno == ECONNRESET)) << r << " " << std::strerror(errno);
      closed = true;
      break;
    }
    (void)send(sock, "x", 1, MSG_NOSIGNAL);
    if (i == 1) {
      EXPECT_TRUE(Served());  // mid-trickle, another peer gets its answer
    }
  }
  close(sock);
  EXPECT_TRUE(closed) << "a request trickled for 12 s still holds its connection";
  EXPECT_TRUE(Served());
}

TEST_F(FdSocketTest, AcceptRetriesAtOnceWhenAConnectionWentAway) {
  FdServerOptions o;
  o.accept_backoff = absl::Hours(1);  // a back-off here would hang the test
  o.accept = FailingAccept({EINTR, ECONNABORTED, EPROTO});
  Restart(std::move(o));
  EXPECT_TRUE(Served());
  EXPECT_EQ(accept_calls_.load(), 4);
}

// Whether thread tid of this process is blocked in poll(2) (or ppoll) on a single fd,
// from /proc/self/task/TID/syscall ("NR ARG0 ARG1 ...", or "running"). The accept loop
// polls two fds (stop pipe and listening socket); its back-off waits on the stop pipe alone.
bool BlockedPollingOneFd(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/syscall");
  long nr = -1;
  std::string fds, nfds;
  if (!(in >> nr >> fds >> nfds)) return false;  // "running", or the thread is gone
  bool poll = false;
#ifdef SYS_poll
  poll |= nr == SYS_poll;
#endif
  poll |= nr == SYS_ppoll;
  return poll && std::stoul(nfds, nullptr, 16) == 1;
}

// Shown by what the acceptor does, not by how long the test watched: after the failed
// accept it must block in its back-off (1 h here: nothing but the server's destruction
// ends it) with no second accept. A loop that spun would call accept again, or at best
// never block there and run the wait into its 60 s bound.
TEST_F(FdSocketTest, AcceptBacksOffInsteadOfSpinningWhenOutOfFds) {
  FdServerOptions o;
  o.accept_backoff = absl::Hours(1);
  o.accept = FailingAccept(std::vector<int>(1000, EMFILE));
  Restart(std::move(o));
  const int sock = *ConnectUnix(server_->path());  // stays queued: accept keeps failing
  bool backing_off = false;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(60);
       !backing_off && accept_calls_.load() <= 1 && absl::Now() < deadline;) {
    backing_off = accept_calls_.load() == 1 && BlockedPollingOneFd(accept_tid_.load());
    if (!backing_off) absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_TRUE(backing_off) << accept_calls_.load() << " accept calls";
  EXPECT_EQ(accept_calls_.load(), 1);
  server_.reset();  // wakes the back-off
  EXPECT_EQ(accept_calls_.load(), 1);
  close(sock);
}

TEST_F(FdSocketTest, AcceptKeepsTryingAfterRunningOutOfFdsAndMemory) {
  FdServerOptions o;
  o.accept_backoff = absl::Milliseconds(1);
  o.accept = FailingAccept({EMFILE, ENFILE, ENOBUFS, ENOMEM, EMFILE});
  Restart(std::move(o));
  EXPECT_TRUE(Served());
  EXPECT_EQ(accept_calls_.load(), 6);
}

// A server that answers one request per connection and then closes it, as the daemon
// does to a connection that idled past --fd_idle_timeout. before_reply, when given, runs
// with each request before it is answered (a test changes the store there).
class OneRequestPerConnection {
 public:
  OneRequestPerConnection(const std::string& path, KvStore* store,
                          std::function<void(const v1::FdRequest&)> before_reply = {})
      : store_(store), before_reply_(std::move(before_reply)) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listen_fd_, 8), 0);
    thread_ = std::thread([this] { Run(); });
  }
  ~OneRequestPerConnection() {
    shutdown(listen_fd_, SHUT_RDWR);  // wakes accept
    thread_.join();
    close(listen_fd_);
  }
  int connections() const { return connections_.load(); }

 private:
  void Run() {
    for (int conn; (conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC)) >= 0; close(conn)) {
      connections_.fetch_add(1);
      absl::StatusOr<Message> in = RecvMessage(conn);
      if (!in.ok()) continue;
      if (before_reply_) {
        v1::FdRequest req;
        if (req.ParseFromString(in->bytes)) before_reply_(req);
      }
      std::vector<SharedPiece> pieces;
      const v1::FdReply reply = HandleFdRequest(*store_, in->bytes, absl::OkStatus(), &pieces);
      std::vector<int> fds;
      for (const SharedPiece& p : pieces) fds.push_back(p.fd);
      EXPECT_TRUE(SendMessage(conn, reply.SerializeAsString(), fds).ok());
      for (int fd : fds) close(fd);
    }
  }

  KvStore* const store_;
  const std::function<void(const v1::FdRequest&)> before_reply_;
  int listen_fd_ = -1;
  std::atomic<int> connections_{0};
  std::thread thread_;
};

TEST_F(FdSocketTest, RegionClientReconnectsWhenTheServerClosedItsConnection) {
  const std::string path = (dir_ / "one.fds").string();
  OneRequestPerConnection server(path, store_.get());
  const std::string s = *store_->OpenSession("w");
  auto client = RegionClient::Connect(path, s);
  ASSERT_TRUE(client.ok()) << client.status();
  // Lists the regions, then exports the scratch region: the second exchange finds the
  // first connection closed.
  auto scratch = (*client)->GetScratch();
  ASSERT_TRUE(scratch.ok()) << scratch.status();
  std::memcpy(scratch->base, "kv", 2);
  EXPECT_EQ(std::memcmp(store_->ResolveSlice(s, scratch->region_id, 0, 2)->data, "kv", 2), 0);
  // A pool that appears later is mapped over yet another connection.
  auto info = store_->Allocate(s, CacheSpec{1, 2, 8, DType::kFloat32, 4, {}, 0, ""}, "a");
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE((*client)->GetPool(info->pool_id).ok());
  EXPECT_EQ(server.connections(), 4);
}

// Found by the kill storm (tests/stress): another process's last cache of another pool
// goes between the client's ListRegions and that pool's export. The export's NOT_FOUND
// must not fail the mapping of the pool the client asked for.
TEST_F(FdSocketTest, RegionClientMapsItsPoolWhenAnotherPoolGoesWhileItLists) {
  const std::string s = *store_->OpenSession("w");
  auto mine = store_->Allocate(s, CacheSpec{1, 2, 8, DType::kFloat32, 4, {}, 0, ""}, "mine");
  auto other = store_->Allocate("", CacheSpec{1, 2, 16, DType::kFloat32, 4, {}, 0, ""}, "other");
  ASSERT_TRUE(mine.ok() && other.ok());
  const uint64_t doomed = other->pool_id;
  KvStore* store = store_.get();
  const std::string path = (dir_ / "racing.fds").string();
  OneRequestPerConnection server(path, store, [store, doomed](const v1::FdRequest& req) {
    if (req.has_export_region() && req.export_region().region_id() == doomed + 1) {
      EXPECT_TRUE(store->Release("", "other").ok());  // its pool goes with it
    }
  });
  auto client = RegionClient::Connect(path, s);
  ASSERT_TRUE(client.ok()) << client.status();
  auto pool = (*client)->GetPool(mine->pool_id);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_NE(pool->base, nullptr);
  EXPECT_EQ((*client)->GetPool(doomed).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvarena
