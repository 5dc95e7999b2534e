// Attach streams against a real kvarenad: many held streams take no thread and burn no CPU
// while unary calls go on; every stream hears of each pool created or destroyed, once; the
// session and per-peer bounds refuse with their numbers; TCP sessions charge no scratch;
// shutdown ends every stream.
#include "daemon/attach.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using grpc::StatusCode;

class AttachTest : public KvarenadTest {
 protected:
  struct Stream {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> reader;
    v1::AttachEvent first;
  };

  // Without scratch regions, so hundreds of sessions fit any arena and a stream's region
  // list holds the pools only.
  void SetUp() override { StartDaemon({"--arena_bytes=64Mi", "--scratch_bytes=0"}); }

  void TearDown() override {
    for (Stream& s : streams_) {
      s.context->TryCancel();
      s.reader->Finish();
    }
    streams_.clear();
    KvarenadTest::TearDown();
  }

  // `n` channels to the daemon's Unix socket, each its own connection.
  std::vector<std::shared_ptr<grpc::Channel>> Channels(int n) {
    std::vector<std::shared_ptr<grpc::Channel>> out;
    for (int i = 0; i < n; ++i) out.push_back(daemon_->NewChannel());
    return out;
  }

  // A channel to the TCP address `tcp`, its own connection (and port).
  static std::shared_ptr<grpc::Channel> TcpChannel(const std::string& tcp) {
    static int next = 0;
    grpc::ChannelArguments args;
    args.SetInt("kvarena.test.tcp_channel", next++);
    return grpc::CreateCustomChannel(tcp, grpc::InsecureChannelCredentials(), args);
  }

  // Opens a stream on `channel` (resuming resume_token's session when not empty): OK once
  // its first event came (the stream is then held until the test ends, last in streams_),
  // else the status the daemon ended it with.
  grpc::Status TryOpen(const std::shared_ptr<grpc::Channel>& channel,
                       const std::string& resume_token = "") {
    Stream s;
    s.context = std::make_unique<grpc::ClientContext>();
    v1::AttachRequest req;
    req.set_client_name("attach-test");
    req.set_resume_token(resume_token);
    s.reader = v1::KvCacheService::NewStub(channel)->Attach(s.context.get(), req);
    if (!s.reader->Read(&s.first)) return s.reader->Finish();
    streams_.push_back(std::move(s));
    return grpc::Status::OK;
  }

  // `n` streams spread round-robin over `channels`.
  void OpenMany(int n, const std::vector<std::shared_ptr<grpc::Channel>>& channels) {
    for (int i = 0; i < n; ++i) {
      const grpc::Status s = TryOpen(channels[size_t(i) % channels.size()]);
      ASSERT_TRUE(s.ok()) << "stream " << i << ": " << ::testing::PrintToString(s);
    }
  }

  // The pool ids an event lists, in order.
  static std::vector<uint64_t> PoolIds(const v1::AttachEvent& event) {
    std::vector<uint64_t> ids;
    for (const v1::RegionDescriptor& r : event.regions()) ids.push_back(r.pool_id());
    return ids;
  }

  // Every stream's next event must list exactly these pools.
  void ExpectNextEventListsPools(const std::vector<uint64_t>& pools) {
    for (Stream& s : streams_) {
      v1::AttachEvent event;
      ASSERT_TRUE(s.reader->Read(&event));
      EXPECT_EQ(event.session_id(), s.first.session_id());
      EXPECT_EQ(PoolIds(event), pools);
    }
  }

  // The daemon's CPU time so far, in clock ticks (utime + stime of /proc/PID/stat).
  uint64_t DaemonCpuTicks() const {
    std::ifstream in("/proc/" + std::to_string(daemon_->pid()) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // after "pid (comm) "
    std::string skip;
    for (int i = 3; i < 14; ++i) fields >> skip;  // state .. cmajflt: fields 3 to 13
    uint64_t utime = 0, stime = 0;
    fields >> utime >> stime;
    return utime + stime;
  }

  // The daemon's thread count (/proc/PID/status).
  int DaemonThreads() const {
    std::ifstream in("/proc/" + std::to_string(daemon_->pid()) + "/status");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
    }
    return -1;
  }

  std::vector<Stream> streams_;
};

v1::CacheSpec Geometry(int head_dim) { return Spec(1, 1, head_dim); }

TEST(PeerHostTest, StripsThePortAndNamesNoUnixPeer) {
  EXPECT_EQ(PeerHost("ipv4:127.0.0.1:5555"), "127.0.0.1");
  EXPECT_EQ(PeerHost("ipv6:[::1]:5555"), "::1");
  EXPECT_EQ(PeerHost("ipv6:%5B::1%5D:5555"), "::1");
  EXPECT_EQ(PeerHost("unix:/tmp/kvarena.sock"), "");
  EXPECT_EQ(PeerHost("unix:"), "");
}

// A resumed stream's first event carries a new token; the one it presented resumes
// nothing any more (a stream taken over cannot take the session back).
TEST_F(AttachTest, AResumeRotatesTheToken) {
  const std::shared_ptr<grpc::Channel> channel = daemon_->NewChannel();
  ASSERT_TRUE(TryOpen(channel).ok());
  const v1::AttachEvent opened = streams_.back().first;
  ASSERT_TRUE(TryOpen(channel, opened.resume_token()).ok());
  const v1::AttachEvent resumed = streams_.back().first;
  EXPECT_TRUE(resumed.resumed());
  EXPECT_EQ(resumed.session_id(), opened.session_id());
  EXPECT_EQ(resumed.resume_token().size(), 32u);
  EXPECT_NE(resumed.resume_token(), opened.resume_token());
  EXPECT_EQ(TryOpen(channel, opened.resume_token()).error_code(), StatusCode::NOT_FOUND);
  ASSERT_TRUE(TryOpen(channel, resumed.resume_token()).ok());
  EXPECT_EQ(streams_.back().first.session_id(), opened.session_id());
}

// 300 streams on 3 connections: a sync server would hold a thread for each.
TEST_F(AttachTest, HeldStreamsTakeNoThreadsAndUnaryCallsGoOn) {
  constexpr int kStreams = 300;
  StartDaemon({"--arena_bytes=64Mi", "--scratch_bytes=0", "--num_threads=1",
               "--max_sessions_per_peer=300"});  // one uid holds them all
  // The first stream starts the threads of the callback machinery; the others add none.
  ASSERT_NO_FATAL_FAILURE(OpenMany(1, Channels(1)));
  const int threads_before = DaemonThreads();
  ASSERT_NO_FATAL_FAILURE(OpenMany(kStreams - 1, Channels(3)));

  const int threads = DaemonThreads();
  RecordProperty("threads",
                 absl::StrCat(threads_before, " with 1 stream, ", threads, " with ", kStreams));
  EXPECT_LT(threads, threads_before + kStreams / 2);
  v1::PingResponse pong;
  EXPECT_TRUE(stub_->Ping(Ctx().get(), v1::PingRequest(), &pong).ok());
  EXPECT_EQ(Stats().num_sessions(), uint64_t{kStreams});
  const std::string id = Allocate(Geometry(4));
  EXPECT_TRUE(AppendF32(id, 0, 0, 3, 1, 4, 1).ok());
  EXPECT_EQ(Stats(id).pages().seq_len(), 3u);
}

// Idle streams cost nothing: only the 100 ms reaper runs, about 1 tick (10 ms at 100 Hz)
// over the 2 s measured. The bound, 5 ticks, is a tenth of what polling costs: the sync
// Attach woke every stream each 50 ms (4,000 wake-ups a second for 200 streams) and burned
// 52-55 ticks over the same 2 s on a 2-core builder. CPU time, unlike wall time, does not
// grow when the machine is busy with other work.
TEST_F(AttachTest, IdleStreamsBurnNoCpu) {
  constexpr int kStreams = 200;
  ASSERT_NO_FATAL_FAILURE(OpenMany(kStreams, Channels(2)));
  const uint64_t before = DaemonCpuTicks();
  absl::SleepFor(absl::Seconds(2));
  const uint64_t burned = DaemonCpuTicks() - before;
  RecordProperty("idle_cpu_ticks", std::to_string(burned));
  EXPECT_LE(burned, 5u) << "ticks of " << sysconf(_SC_CLK_TCK) << "/s";
}

TEST_F(AttachTest, EveryStreamHearsOncePerPoolCreatedOrDestroyed) {
  ASSERT_NO_FATAL_FAILURE(OpenMany(20, Channels(2)));
  for (const Stream& s : streams_) EXPECT_EQ(s.first.regions_size(), 0);

  const std::string first = Allocate(Geometry(4));  // pool 0
  ExpectNextEventListsPools({0});
  const std::string second = Allocate(Geometry(8));  // pool 1
  ExpectNextEventListsPools({0, 1});
  Allocate(Geometry(4));  // pool 0 again: no change, no event
  v1::ReleaseRequest release;
  release.set_cache_id(second);  // pool 1's last cache: the pool goes
  v1::ReleaseResponse released;
  ASSERT_TRUE(stub_->Release(Ctx().get(), release, &released).ok());
  ExpectNextEventListsPools({0});
  // Had any change sent two events, this read would see the stale second one.
  Allocate(Geometry(16));  // pool 2
  ExpectNextEventListsPools({0, 2});
}

// Changes during a write in flight are coalesced: at most one event per change, and the
// last one lists every pool.
TEST_F(AttachTest, ABurstOfNewPoolsEndsWithTheWholeListOnEveryStream) {
  constexpr int kPools = 8;
  ASSERT_NO_FATAL_FAILURE(OpenMany(10, Channels(2)));
  std::vector<uint64_t> all;
  for (int i = 0; i < kPools; ++i) {
    Allocate(Geometry(4 * (i + 1)));
    all.push_back(uint64_t(i));
  }
  for (Stream& s : streams_) {
    v1::AttachEvent event;
    int events = 0;
    do {
      ASSERT_TRUE(s.reader->Read(&event));
      ++events;
    } while (PoolIds(event) != all && events < kPools);
    EXPECT_EQ(PoolIds(event), all);
  }
}

TEST_F(AttachTest, MaxSessionsRefusesTheFourthAndKeepsTheFirstThree) {
  StartDaemon({"--arena_bytes=64Mi", "--scratch_bytes=0", "--max_sessions=3"});
  ASSERT_NO_FATAL_FAILURE(OpenMany(3, Channels(3)));
  EXPECT_THAT(TryOpen(daemon_->NewChannel()),
              StatusIs(StatusCode::RESOURCE_EXHAUSTED, "max_sessions=3"));

  EXPECT_EQ(Stats().num_sessions(), 3u);
  for (const Stream& s : streams_) {
    const std::string id = Allocate(Geometry(4), s.first.session_id());
    EXPECT_TRUE(AppendF32(id, 0, 0, 2, 1, 4, 1, s.first.session_id()).ok());
  }
  ExpectNextEventListsPools({0});  // the first Allocate made the pool
}

TEST_F(AttachTest, MaxAttachPerPeerBoundsTcpPeersOnly) {
  TempDir dir;
  const std::string tcp = "127.0.0.1:" + std::to_string(PickUnusedPort());
  StartDaemon({"--listen=unix:" + dir.path() + "/k.sock," + tcp, "--arena_bytes=64Mi",
               "--scratch_bytes=0", "--max_attach_per_peer=2"});
  ASSERT_NO_FATAL_FAILURE(OpenMany(2, {TcpChannel(tcp), TcpChannel(tcp)}));
  const auto third = TcpChannel(tcp);
  EXPECT_THAT(TryOpen(third), StatusIs(StatusCode::RESOURCE_EXHAUSTED,
                                       "peer 127.0.0.1 holds 2 Attach streams; "
                                       "max_attach_per_peer=2"));
  v1::PingResponse pong;
  EXPECT_TRUE(v1::KvCacheService::NewStub(third)->Ping(Ctx().get(), v1::PingRequest(), &pong).ok());
  // Unix-socket peers count against max_sessions only.
  ASSERT_NO_FATAL_FAILURE(OpenMany(3, Channels(1)));

  // A stream that ends gives its slot back, once the daemon has seen it end.
  streams_[1].context->TryCancel();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  grpc::Status reopened = TryOpen(third);
  while (!reopened.ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    reopened = TryOpen(third);
  }
  EXPECT_TRUE(reopened.ok()) << ::testing::PrintToString(reopened);
}

// A TCP peer cannot map a scratch region: its sessions are listed none and charge nothing.
TEST_F(AttachTest, IdleTcpStreamsChargeNoScratch) {
  TempDir dir;
  const std::string tcp = "127.0.0.1:" + std::to_string(PickUnusedPort());
  StartDaemon({"--listen=unix:" + dir.path() + "/k.sock," + tcp, "--arena_bytes=8Mi",
               "--scratch_bytes=4Mi", "--max_attach_per_peer=64"});
  ASSERT_NO_FATAL_FAILURE(OpenMany(64, {TcpChannel(tcp), TcpChannel(tcp)}));
  for (const Stream& s : streams_) EXPECT_EQ(s.first.regions_size(), 0);
  // A Unix-socket session is told of its scratch region, which costs nothing until mapped.
  ASSERT_NO_FATAL_FAILURE(OpenMany(1, Channels(1)));
  ASSERT_EQ(streams_.back().first.regions_size(), 1);
  EXPECT_TRUE(streams_.back().first.regions(0).scratch());
  EXPECT_EQ(streams_.back().first.regions(0).size(), uint64_t{4} << 20);
  v1::StatsResponse stats = Stats();
  EXPECT_EQ(stats.num_sessions(), 65u);
  EXPECT_EQ(stats.bytes_committed(), 0u);
  EXPECT_EQ(stats.scratch_regions(), 0u);

  // Another caller gets every page of the arena: 256 pages of 32 KiB.
  const std::string id = Allocate(Spec(1, 8, 128));
  EXPECT_TRUE(AppendF32(id, 0, 0, 1024, 8, 128, 1.0f).ok());
  stats = Stats();
  EXPECT_EQ(stats.bytes_committed(), uint64_t{8} << 20);
  EXPECT_EQ(stats.pages().pages_used(), 256u);
}

// kvarenad accepts on its Unix socket itself and learns each peer's uid (SO_PEERCRED):
// one uid holds at most --max_sessions_per_peer sessions, whatever connections it opens.
TEST_F(AttachTest, MaxSessionsPerPeerBoundsOneUid) {
  TempDir dir;
  const std::string tcp = "127.0.0.1:" + std::to_string(PickUnusedPort());
  StartDaemon({"--listen=unix:" + dir.path() + "/k.sock," + tcp, "--arena_bytes=64Mi",
               "--scratch_bytes=0", "--max_sessions=1024", "--max_sessions_per_peer=256"});
  ASSERT_NO_FATAL_FAILURE(OpenMany(256, Channels(4)));
  EXPECT_THAT(TryOpen(daemon_->NewChannel()),
              StatusIs(StatusCode::RESOURCE_EXHAUSTED,
                       "uid " + std::to_string(getuid()) +
                           " holds 256 sessions (attached or in "
                           "their grace period); max_sessions_per_peer=256"));
  // The cap's other side: a TCP peer's session, and sessionless calls of the operator.
  EXPECT_TRUE(TryOpen(TcpChannel(tcp)).ok());
  EXPECT_FALSE(Allocate(Spec(1, 2, 8)).empty());
  EXPECT_EQ(Stats().num_sessions(), 257u);
}

TEST_F(AttachTest, SigtermEndsEveryStreamWithUnavailableAndExitsZero) {
  ASSERT_NO_FATAL_FAILURE(OpenMany(50, Channels(2)));
  daemon_->Signal(SIGTERM);
  for (Stream& s : streams_) {
    v1::AttachEvent event;
    EXPECT_FALSE(s.reader->Read(&event));
    EXPECT_THAT(s.reader->Finish(), StatusIs(StatusCode::UNAVAILABLE, "shutting down"));
  }
  streams_.clear();
  const std::optional<int> status = daemon_->WaitExit(absl::Seconds(10));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
}

}  // namespace
}  // namespace kvarena
