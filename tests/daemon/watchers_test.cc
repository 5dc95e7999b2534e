// WatchEvents watchers against a real kvarenad: watchers that stop reading do not hold up
// prefix registrations — they are dropped with the seq to resume from, and a watcher that
// resumes there gets every event after it; one TCP peer address, or one Unix-socket uid over
// all its connections, holds at most --max_watchers_per_peer streams.
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "proto/wire.h"
#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using grpc::StatusCode;

constexpr int kLayers = 32;
constexpr int kPromptTokens = 512;  // 128 pages of 4: 4096 BlockStored events per cache

class WatchersTest : public KvarenadTest {
 protected:
  struct Watcher {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReader<v1::WatchEventsResponse>> reader;
    v1::WatchEventsResponse first;
    uint64_t next_seq = 0;  // of the last message read
  };

  void TearDown() override {
    for (Watcher& w : watchers_) {
      w.context->TryCancel();
      w.reader->Finish();
    }
    watchers_.clear();
    KvarenadTest::TearDown();
  }

  // Opens a watcher from `from_seq` on `channel`: OK once its first message came (kept in
  // watchers_), else the status the daemon refused it with.
  grpc::Status TryWatch(const std::shared_ptr<grpc::Channel>& channel, uint64_t from_seq = 0) {
    Watcher w;
    w.context = std::make_unique<grpc::ClientContext>();
    // Past any test runner's timeout: under load the runner, not this deadline, decides.
    w.context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(900));
    v1::WatchEventsRequest req;
    req.set_from_seq(from_seq);
    w.reader = v1::KvCacheService::NewStub(channel)->WatchEvents(w.context.get(), req);
    if (!w.reader->Read(&w.first)) return w.reader->Finish();
    w.next_seq = w.first.next_seq();
    watchers_.push_back(std::move(w));
    return grpc::Status::OK;
  }

  // A channel whose streams stall as soon as they stop reading: a small flow-control
  // window that does not grow.
  std::shared_ptr<grpc::Channel> StallingChannel() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
    args.SetInt("kvarena.test.stalling_channel", 1);
    return grpc::CreateCustomChannel(daemon_->address(), grpc::InsecureChannelCredentials(), args);
  }

  // Registers a prompt of kPromptTokens tokens (from `first_token`) on every layer of a
  // new cache: kLayers * kPromptTokens / 4 BlockStored events. Returns the calls that
  // succeeded.
  int Register(int32_t first_token, const std::string& id) {
    v1::AllocateRequest req;
    *req.mutable_spec() = Spec(kLayers, 1, 8);  // page_size 4
    req.mutable_spec()->set_prefix_namespace("watchers");
    req.set_cache_id(id);
    for (int32_t t = 0; t < kPromptTokens; ++t) req.add_prompt_tokens(first_token + t);
    v1::AllocateResponse resp;
    int ok = stub_->Allocate(Ctx().get(), req, &resp).ok() ? 1 : 0;
    for (uint32_t l = 0; l < kLayers; ++l)
      ok += AppendF32(id, l, 0, kPromptTokens, 1, 8, 1.0f + l).ok();
    return ok;
  }

  std::vector<Watcher> watchers_;
};

TEST_F(WatchersTest, StalledWatchersAreDroppedAndResumeFromTheirSeq) {
  // 64 watchers of this uid; the backlog at its default, named.
  StartDaemon({"--arena_bytes=64Mi", "--max_watchers_per_peer=64", "--watcher_max_backlog=4096"});
  const std::shared_ptr<grpc::Channel> stalling = StallingChannel();
  for (int i = 0; i < 64; ++i) {
    const grpc::Status s = TryWatch(stalling);
    ASSERT_TRUE(s.ok()) << "watcher " << i << ": " << ::testing::PrintToString(s);
  }
  // 64 watchers that read nothing more while 12288 events are recorded. A watcher is
  // dropped for the events recorded while one of its writes waits: the first 4096 make the
  // daemon start a write to each (it stalls on the small window); the pause lets its
  // dispatcher do that even on a loaded machine, so the next 8192 find every write waiting.
  int calls_ok = Register(100000, "c0");
  absl::SleepFor(absl::Milliseconds(500));
  for (int c = 1; c < 3; ++c) calls_ok += Register(100000 * (c + 1), "c" + std::to_string(c));
  EXPECT_EQ(calls_ok, 3 * (1 + kLayers));
  const uint64_t end_seq = 3 * kLayers * kPromptTokens / 4 + 1;

  // Each stalled watcher gets what was in flight, then its end, naming where to resume.
  std::vector<uint64_t> resume_seqs;
  for (Watcher& w : watchers_) {
    v1::WatchEventsResponse msg;
    while (w.reader->Read(&msg)) w.next_seq = msg.next_seq();
    const grpc::Status end = w.reader->Finish();
    EXPECT_THAT(end, StatusIs(StatusCode::RESOURCE_EXHAUSTED,
                              "watch again with from_seq=" + std::to_string(w.next_seq)));
    const auto& trailers = w.context->GetServerTrailingMetadata();
    auto it = trailers.find(kResumeFromSeqMetadataKey);
    ASSERT_NE(it, trailers.end());
    uint64_t resume = 0;
    ASSERT_TRUE(absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &resume));
    EXPECT_EQ(resume, w.next_seq);
    EXPECT_LT(resume, end_seq);
    resume_seqs.push_back(resume);
  }
  watchers_.clear();

  // A watcher resuming at the first one's seq gets every event after it, in order, none lost
  // (its slot frees once the daemon has seen a dropped stream end).
  const std::shared_ptr<grpc::Channel> channel = daemon_->NewChannel();
  grpc::Status resumed = TryWatch(channel, resume_seqs[0]);
  for (int tries = 0; tries < 500 && resumed.error_code() == StatusCode::RESOURCE_EXHAUSTED;
       ++tries) {
    absl::SleepFor(absl::Milliseconds(20));
    resumed = TryWatch(channel, resume_seqs[0]);
  }
  ASSERT_TRUE(resumed.ok()) << ::testing::PrintToString(resumed);
  Watcher& w = watchers_.back();
  uint64_t expected = resume_seqs[0];
  v1::WatchEventsResponse msg = w.first;
  do {
    EXPECT_FALSE(msg.events_lost());
    for (const v1::KvEvent& e : msg.events()) ASSERT_EQ(e.seq(), expected++);
    w.next_seq = msg.next_seq();
  } while (w.next_seq < end_seq && w.reader->Read(&msg));
  EXPECT_EQ(expected, end_seq);
  EXPECT_EQ(w.next_seq, end_seq);
}

TEST_F(WatchersTest, MaxWatchersPerPeerBoundsATcpAddressAndAUnixUid) {
  const std::string tcp = "127.0.0.1:" + std::to_string(PickUnusedPort());
  TempDir dir;
  StartDaemon({"--listen=unix:" + dir.path() + "/k.sock," + tcp, "--arena_bytes=64Mi",
               "--max_watchers_per_peer=2"});
  const auto tcp_channel = grpc::CreateChannel(tcp, grpc::InsecureChannelCredentials());
  ASSERT_TRUE(TryWatch(tcp_channel).ok());
  ASSERT_TRUE(TryWatch(tcp_channel).ok());
  EXPECT_THAT(TryWatch(tcp_channel), StatusIs(StatusCode::RESOURCE_EXHAUSTED,
                                              "peer 127.0.0.1 holds 2 WatchEvents streams; "
                                              "max_watchers_per_peer=2"));
  // One uid over the Unix socket: its connections (a channel each) count together.
  ASSERT_TRUE(TryWatch(daemon_->NewChannel()).ok());
  ASSERT_TRUE(TryWatch(daemon_->NewChannel()).ok());
  EXPECT_THAT(TryWatch(daemon_->NewChannel()),
              StatusIs(StatusCode::RESOURCE_EXHAUSTED,
                       "watch_events: uid " + std::to_string(getuid()) +
                           " holds 2 WatchEvents streams; max_watchers_per_peer=2"));
  EXPECT_EQ(watchers_.size(), 4u);
  // The refusals took nothing: a watcher that goes frees its slot for its uid, and other
  // calls are served meanwhile.
  watchers_.back().context->TryCancel();
  watchers_.back().reader->Finish();
  watchers_.pop_back();
  grpc::Status again = TryWatch(daemon_->NewChannel());
  for (int tries = 0; tries < 500 && again.error_code() == StatusCode::RESOURCE_EXHAUSTED;
       ++tries) {
    absl::SleepFor(absl::Milliseconds(20));  // until the daemon has seen the stream end
    again = TryWatch(daemon_->NewChannel());
  }
  EXPECT_TRUE(again.ok()) << ::testing::PrintToString(again);
  EXPECT_FALSE(Allocate(Spec(1, 2, 8)).empty());
}

}  // namespace
}  // namespace kvarena
