// A real kvarenad whose tier reads hang (a StalledRedis as its Redis tier, --tier_timeout
// long): Health/Check, Ping and Stats still answer within their 1 s deadline, because an
// Allocate that may read the tiers runs on the daemon's pool, never on gRPC's few callback
// threads; and the pool, holding those hung calls, refuses a prefill Append past
// --max_queued_bytes. Nothing asserts on time beyond the calls' deadlines.
#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/daemon/prompt_kv.h"
#include "tests/daemon/stalled_redis.h"

namespace kvarena {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// A call that must answer while the tier reads hang.
constexpr absl::Duration kPromptDeadline = absl::Seconds(1);

std::unique_ptr<grpc::ClientContext> WithDeadline(absl::Duration d) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
  return ctx;
}

class TierHangTest : public KvarenadTest {
 protected:
  // The daemon's own SetUp start is replaced: each test starts one with the stalled tier.
  void SetUp() override {
    ASSERT_NE(redis_.port(), 0) << "no loopback listener";
    std::printf("prompt from fixed seed 41\n");
  }

  void TearDown() override {
    FinishHung();
    KvarenadTest::TearDown();
  }

  void Start(const std::vector<std::string>& more) {
    std::vector<std::string> flags = {"--arena_bytes=2Mi", "--tier_chunk_pages=2",
                                      "--tier_redis=127.0.0.1:" + std::to_string(redis_.port()),
                                      // Far past the test: only Stop ends the reads.
                                      "--tier_timeout=120s"};
    flags.insert(flags.end(), more.begin(), more.end());
    StartDaemon(flags);
  }

  // Starts n Allocates of one prompt whose chunk no tier holds: each reads the Redis tier
  // (the first) or waits for that read (the others). Returns once the read has stalled.
  void HangAllocates(int n) {
    const Prompt p = MakePrompt(9, 41);  // one 2-page chunk past nothing
    hung_ = std::make_unique<absl::BlockingCounter>(n);
    calls_.resize(size_t(n));
    for (Call& c : calls_) {
      *c.req.mutable_spec() = Spec(kPromptLayers, kPromptHeads, kPromptDim);
      c.req.mutable_spec()->set_prefix_namespace("model");
      c.req.mutable_prompt_tokens()->Assign(p.tokens.begin(), p.tokens.end());
      c.ctx = WithDeadline(absl::Seconds(150));
      stub_->async()->Allocate(c.ctx.get(), &c.req, &c.resp, [this, &c](grpc::Status s) {
        c.status = std::move(s);
        hung_->DecrementCount();
      });
    }
    ASSERT_TRUE(redis_.WaitStalled(absl::Seconds(30))) << "no tier read reached the peer";
  }

  // Ends the hung reads; every hung Allocate then succeeds with a miss.
  void FinishHung() {
    redis_.Stop();
    if (hung_ == nullptr) return;
    hung_->Wait();
    for (const Call& c : calls_) {
      EXPECT_TRUE(c.status.ok()) << c.status.error_message();
      EXPECT_EQ(c.resp.cache().cached_tokens(), 0u);
    }
    hung_ = nullptr;
  }

  // Health/Check, Ping and Stats, each with a deadline of kPromptDeadline.
  void ExpectPromptAnswers() {
    HealthCheckRequest hreq;
    HealthCheckResponse hresp;
    const grpc::Status health = Health::NewStub(daemon_->NewChannel())
                                    ->Check(WithDeadline(kPromptDeadline).get(), hreq, &hresp);
    EXPECT_TRUE(health.ok()) << health.error_message();
    EXPECT_EQ(hresp.status(), HealthCheckResponse::SERVING);
    v1::PingResponse pong;
    const grpc::Status ping =
        stub_->Ping(WithDeadline(kPromptDeadline).get(), v1::PingRequest(), &pong);
    EXPECT_TRUE(ping.ok()) << ping.error_message();
    v1::StatsResponse stats;
    const grpc::Status s =
        stub_->Stats(WithDeadline(kPromptDeadline).get(), v1::StatsRequest(), &stats);
    EXPECT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(stats.tiers_size(), 1);
    EXPECT_EQ(stats.tiers(0).medium(), "redis");
  }

  struct Call {
    v1::AllocateRequest req;
    v1::AllocateResponse resp;
    std::unique_ptr<grpc::ClientContext> ctx;
    grpc::Status status;
  };
  StalledRedis redis_;
  std::vector<Call> calls_;
  std::unique_ptr<absl::BlockingCounter> hung_;
};

// More hung Allocates than gRPC has callback threads (half the cores, 2 to 16, in gRPC
// 1.51), fewer than the pool's 256 threads.
int HungCalls() { return std::clamp(4 * int(std::thread::hardware_concurrency()), 32, 128); }

TEST_F(TierHangTest, HealthPingAndStatsAnswerWhileTierReadsHang) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  ASSERT_NO_FATAL_FAILURE(HangAllocates(HungCalls()));
  ASSERT_NO_FATAL_FAILURE(ExpectPromptAnswers());
  // A short call with no tier to read still runs on a callback thread, and answers.
  const std::string id = Allocate(Spec(kPromptLayers, kPromptHeads, kPromptDim));
  ASSERT_TRUE(AppendF32(id, 0, 0, 4, kPromptHeads, kPromptDim, 1.0f).ok());
  ASSERT_NO_FATAL_FAILURE(FinishHung());
  EXPECT_GE(Stats().tiers(0).errors(), 1u);  // the stalled read, failed once it was stopped
}

TEST_F(TierHangTest, APoolPastMaxQueuedBytesRefusesAPrefillAppend) {
  ASSERT_NO_FATAL_FAILURE(Start({"--max_queued_bytes=64Ki"}));
  const std::string id = Allocate(Spec(kPromptLayers, kPromptHeads, kPromptDim));
  ASSERT_NO_FATAL_FAILURE(HangAllocates(4));  // the pool holds their small requests
  // 2 heads x 8 dims x 4 bytes x 4096 tokens = 256 KiB each of k and v: a pooled Append.
  const grpc::Status s = AppendF32(id, 0, 0, 4096, kPromptHeads, kPromptDim, 1.0f);
  EXPECT_THAT(s, StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, "--max_queued_bytes=65536"));
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr(" request bytes; this call's "));
  EXPECT_EQ(Describe(id).cache().seq_len(), 0u) << "a refused Append changes nothing";
  ASSERT_NO_FATAL_FAILURE(FinishHung());
  // With the pool empty again the same Append runs.
  EXPECT_TRUE(AppendF32(id, 0, 0, 4096, kPromptHeads, kPromptDim, 1.0f).ok());
}

// A pool displaced at --max_pools=1 while the tier's writer hangs on a chunk of it (a SET
// the stalled peer never answers, the pool's other chunks queued behind it): the Allocate
// that displaces it, Health, Ping and Stats all answer within their deadlines, since a
// displaced pool is destroyed, and its cached pages handed down, outside the locks calls
// take, and the writer waits holding only its own queue.
TEST_F(TierHangTest, APoolDisplacedWhileTheTierWriterHangsLeavesCallsAnswering) {
  ASSERT_NO_FATAL_FAILURE(Start({"--max_pools=1"}));
  // No prompt at Allocate (a lookup would hang too): the tokens are declared instead, so
  // the computed pages register and their full chunks go to the (hung) Redis writer.
  const Prompt p = MakePrompt(9, 41);
  v1::CacheSpec spec = Spec(kPromptLayers, kPromptHeads, kPromptDim);
  spec.set_prefix_namespace("model");
  const std::string id = Allocate(spec);
  v1::SetTokensRequest declare;
  declare.set_cache_id(id);
  declare.mutable_token_ids()->Assign(p.tokens.begin(), p.tokens.end());
  v1::SetTokensResponse declared;
  ASSERT_TRUE(stub_->SetTokens(WithDeadline(kPromptDeadline).get(), declare, &declared).ok());
  ASSERT_NO_FATAL_FAILURE(ComputePrompt(stub_.get(), id, p, 0));
  ASSERT_TRUE(redis_.WaitStalled(absl::Seconds(30))) << "no chunk write reached the peer";
  ASSERT_NO_FATAL_FAILURE(ReleaseCache(stub_.get(), id));  // the pool is idle, pages cached
  EXPECT_GT(Stats().pages().pages_cached(), 0u);

  v1::AllocateRequest other;  // another geometry: the idle pool gives way
  *other.mutable_spec() = Spec(kPromptLayers, kPromptHeads, 2 * kPromptDim);
  v1::AllocateResponse made;
  const grpc::Status s = stub_->Allocate(WithDeadline(kPromptDeadline).get(), other, &made);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_NO_FATAL_FAILURE(ExpectPromptAnswers());
  const v1::StatsResponse stats = Stats();
  ASSERT_EQ(stats.pools_size(), 1);
  EXPECT_EQ(stats.pools(0).head_dim(), uint32_t(2 * kPromptDim));
}

}  // namespace
}  // namespace kvarena
