// The cluster tier end to end (docs/redis-tier.md): two kvarenad processes with separate
// arenas — node A and node B — over one Redis Cluster of real redis-server processes
// (3 primaries + 3 replicas). A prefix A computed is adopted by B from Redis, bit for bit;
// a value overwritten with garbage or another prefix's chunk is a miss, counted; a stopped
// primary costs an Allocate at most --tier_timeout and then nothing (the breaker); a
// cluster unreachable at start leaves the daemon serving with the tier down; one plain
// redis-server works as the tier too.
#include <signal.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "tests/daemon/prompt_kv.h"
#include "tests/redis/redis_harness.h"
#include "tests/support/status_matchers.h"
#include "tiers/redis/redis_store.h"

namespace kvarena {
namespace {

using testing::ClusterOf;
using testing::IsOk;
using testing::PlainRedis;
using testing::RedisInstalled;
using testing::RedisTestCluster;

// One kvarenad with its stub.
struct Node {
  explicit Node(std::vector<std::string> flags) : daemon(std::move(flags)) {
    ready = daemon.WaitServing(absl::Seconds(20));
    stub = v1::KvCacheService::NewStub(daemon.NewChannel());
  }
  v1::TierStats Redis() {
    v1::StatsRequest req;
    v1::StatsResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub->Stats(&ctx, req, &resp).ok());
    for (const v1::TierStats& t : resp.tiers()) {
      if (t.medium() == "redis") return t;
    }
    ADD_FAILURE() << "no redis tier: " << resp.DebugString();
    return {};
  }
  DaemonProcess daemon;
  bool ready = false;
  std::unique_ptr<v1::KvCacheService::Stub> stub;
};

class RedisNodesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RedisInstalled()) GTEST_SKIP() << "redis-server or redis-cli is not installed";
  }
  void StartCluster(const testing::RedisTestClusterOptions& o) {
    auto c = RedisTestCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
  }
  // A node on `seeds` (the cluster's by default): 2 MiB arena, chunks of 2 pages.
  std::unique_ptr<Node> StartNode(std::string seeds = "", std::vector<std::string> more = {}) {
    std::vector<std::string> flags = {"--arena_bytes=2Mi", "--tier_chunk_pages=2",
                                      "--tier_redis=" + (seeds.empty() ? cluster_->Seeds() : seeds),
                                      "--tier_timeout=1500ms"};
    flags.insert(flags.end(), more.begin(), more.end());
    auto node = std::make_unique<Node>(flags);
    EXPECT_TRUE(node->ready) << node->daemon.Log();
    return node;
  }
  // A computes p (every full chunk goes to Redis as it fills) and waits for the writes.
  void ComputeOn(Node& a, const Prompt& p, uint64_t chunks_before) {
    const v1::CacheInfo info = AllocatePrompt(a.stub.get(), p.tokens);
    ASSERT_NO_FATAL_FAILURE(ComputePrompt(a.stub.get(), info.cache_id(), p, 0));
    const uint64_t want = chunks_before + (p.tokens.size() - 1) / 8;
    for (int i = 0; i < 1000 && a.Redis().stored_chunks() < want; ++i)
      absl::SleepFor(absl::Milliseconds(10));
    ASSERT_EQ(a.Redis().stored_chunks(), want);
  }

  // Fills node's arena with a namespace-less cache, evicting every cached page.
  void Pressure(Node& node) {
    v1::AllocateRequest req;
    *req.mutable_spec() = Spec(kPromptLayers, kPromptHeads, kPromptDim);
    v1::AllocateResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(node.stub->Allocate(&ctx, req, &resp).ok());
    for (uint32_t l = 0; l < kPromptLayers; ++l) {
      v1::AppendRequest append;
      append.set_cache_id(resp.cache().cache_id());
      append.set_layer(l);
      *append.mutable_k() = F32Tensor(kPromptHeads, 2048 * 4, kPromptDim, 1.0f);
      *append.mutable_v() = F32Tensor(kPromptHeads, 2048 * 4, kPromptDim, 2.0f);
      v1::AppendResponse out;
      grpc::ClientContext c;
      ASSERT_TRUE(node.stub->Append(&c, append, &out).ok());
    }
    ReleaseCache(node.stub.get(), resp.cache().cache_id());
  }

  std::unique_ptr<RedisTestCluster> cluster_;
  int fresh_ = 0;
};

TEST_F(RedisNodesTest, APrefixNodeAComputedIsAdoptedOnNodeBBitForBit) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ClusterOf(3, 1)));
  std::unique_ptr<Node> a = StartNode(), b = StartNode();
  const Prompt p = MakePrompt(33, 1);  // 8 pages: 4 chunks, in several slots
  ASSERT_NO_FATAL_FAILURE(ComputeOn(*a, p, 0));
  const v1::CacheInfo got = AllocatePrompt(b->stub.get(), p.tokens);
  EXPECT_EQ(got.cached_tokens(), 32u);
  EXPECT_EQ(got.tier_loaded_tokens(), 32u);  // B computed none of it
  ASSERT_NO_FATAL_FAILURE(ExpectAsRecomputed(b->stub.get(), got, p, "fresh"));
  EXPECT_EQ(b->Redis().hit_chunks(), 4u);
  EXPECT_EQ(b->Redis().loaded_tokens(), 32u);
}

TEST_F(RedisNodesTest, APrimaryKilledUnderTrafficFailsNoRpcAndItsPrefixesHitAgainAfterFailover) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ClusterOf(3, 1)));
  std::unique_ptr<Node> a = StartNode(), b = StartNode();
  std::vector<Prompt> prompts;
  for (uint32_t s = 50; s < 62; ++s) prompts.push_back(MakePrompt(9, s));  // one chunk each
  for (size_t i = 0; i < prompts.size(); ++i) ASSERT_NO_FATAL_FAILURE(ComputeOn(*a, prompts[i], i));
  const absl::StatusOr<std::vector<int>> primaries = cluster_->Primaries();
  ASSERT_TRUE(primaries.ok()) << primaries.status();
  for (int port : *primaries) {
    ASSERT_THAT(cluster_->WaitReplicated(port, absl::Seconds(20)), IsOk());
  }
  cluster_->Signal((*primaries)[0], SIGKILL);
  // B keeps allocating every prompt (each Allocate must succeed: a dead shard is a miss)
  // until all of them hit again, the replica promoted; bounded.
  int rounds = 0, misses = 0;
  bool all_hit = false;
  for (; rounds < 400 && !all_hit; ++rounds) {
    all_hit = true;
    for (const Prompt& p : prompts) {
      const v1::CacheInfo got = AllocatePrompt(b->stub.get(), p.tokens);
      ASSERT_FALSE(got.cache_id().empty());
      if (got.tier_loaded_tokens() == 0 && got.cached_tokens() == 0) {
        all_hit = false;
        ++misses;
      }
      ASSERT_NO_FATAL_FAILURE(ReleaseCache(b->stub.get(), got.cache_id()));
    }
    // What B loaded stays in its arena: push it out so the next round asks Redis again.
    ASSERT_NO_FATAL_FAILURE(Pressure(*b));
    if (!all_hit) absl::SleepFor(absl::Milliseconds(50));
  }
  std::printf("failover: %d rounds of %zu allocates, %d misses while the shard was down\n", rounds,
              prompts.size(), misses);
  EXPECT_TRUE(all_hit);
  EXPECT_TRUE(cluster_->WaitClusterOk(absl::Seconds(20)).ok());
}

TEST_F(RedisNodesTest, AValueOverwrittenWithGarbageOrAnotherPrefixsChunkIsAMissCounted) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ClusterOf(3, 1)));
  std::unique_ptr<Node> a = StartNode(), b = StartNode();
  const Prompt p = MakePrompt(9, 2), q = MakePrompt(9, 3);  // one chunk each
  ASSERT_NO_FATAL_FAILURE(ComputeOn(*a, p, 0));
  ASSERT_NO_FATAL_FAILURE(ComputeOn(*a, q, 1));
  // The two chunks' keys, found by their prefix.
  std::vector<ChunkKey> keys;
  const absl::StatusOr<std::vector<int>> primaries = cluster_->Primaries();
  ASSERT_TRUE(primaries.ok()) << primaries.status();
  for (int port : *primaries) {
    auto out = cluster_->Cli(port, {"--scan", "--pattern", "kva:*"});
    ASSERT_TRUE(out.ok()) << out.status();
    for (absl::string_view k : absl::StrSplit(*out, '\n', absl::SkipEmpty())) {
      const size_t open = k.find('{');
      ASSERT_NE(open, absl::string_view::npos) << k;
      const std::string hex(k.substr(open + 1, 32));
      keys.push_back(ChunkKey{std::stoull(hex.substr(16), nullptr, 16),
                              std::stoull(hex.substr(0, 16), nullptr, 16)});
    }
  }
  ASSERT_EQ(keys.size(), 2u);
  // Through a store of the tests' own: the second key gets the first's chunk (another
  // prefix's, intact), the first gets garbage.
  RedisStoreOptions o;
  o.seeds = cluster_->Seeds();
  auto store = RedisStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::StatusOr<std::string> first = (*store)->Get(keys[0], deadline);
  ASSERT_TRUE(first.ok()) << first.status();
  (*store)->Erase(keys[1]);
  ASSERT_TRUE((*store)->Put(keys[1], *first, nullptr).ok());
  (*store)->Erase(keys[0]);
  ASSERT_TRUE((*store)->Put(keys[0], "not a chunk", nullptr).ok());
  for (const Prompt* x : {&p, &q})
    EXPECT_EQ(AllocatePrompt(b->stub.get(), x->tokens).cached_tokens(), 0u);
  EXPECT_EQ(b->Redis().corrupt_chunks(), 2u);  // both misses, counted, dropped from Redis
  EXPECT_EQ(b->Redis().hit_chunks(), 0u);
}
TEST_F(RedisNodesTest, AStoppedPrimaryCostsOneTimeoutThenTheBreakerAnswersAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ClusterOf(3, 1)));
  const int metrics = PickUnusedPort();
  std::unique_ptr<Node> a = StartNode("", {"--metrics_port=" + std::to_string(metrics)});
  const absl::StatusOr<std::vector<int>> found = cluster_->Primaries();
  ASSERT_TRUE(found.ok()) << found.status();
  const std::vector<int> primaries = *found;
  for (int port : primaries) cluster_->Signal(port, SIGSTOP);
  std::vector<Prompt> prompts;
  for (uint32_t s = 10; s < 16; ++s) prompts.push_back(MakePrompt(9, s));
  // Every Allocate answers (a miss) though no primary does; the breakers open.
  for (const Prompt& p : prompts) {
    const absl::Time start = absl::Now();
    const v1::CacheInfo got = AllocatePrompt(a->stub.get(), p.tokens);
    EXPECT_EQ(got.cached_tokens(), 0u);
    std::printf("allocate with every primary stopped: %s\n",
                absl::FormatDuration(absl::Now() - start).c_str());
  }
  // At most one timeout per primary opened its breaker; the other lookups skipped it.
  EXPECT_GE(a->Redis().errors(), 1u);
  const std::string scraped = GetMetrics(metrics);
  EXPECT_THAT(scraped, ::testing::ContainsRegex("kvarena_tier_redis_breaker_opens_total [1-9]"));
  EXPECT_THAT(scraped, ::testing::ContainsRegex("kvarena_tier_redis_breaker_skips_total [1-9]"));
  for (int port : primaries) cluster_->Signal(port, SIGCONT);
}

TEST_F(RedisNodesTest, AClusterUnreachableAtStartLeavesTheDaemonServingWithTheTierDown) {
  const int port = testing::PickRedisPort();
  std::unique_ptr<Node> a = StartNode("127.0.0.1:" + std::to_string(port));
  const Prompt p = MakePrompt(9, 20);
  const v1::CacheInfo got = AllocatePrompt(a->stub.get(), p.tokens);  // serves: a miss
  EXPECT_EQ(got.cached_tokens(), 0u);
  EXPECT_FALSE(a->Redis().up());
  // The cluster comes up on that port: the tier does too, and takes writes.
  testing::RedisTestClusterOptions o = PlainRedis();
  o.ports = {port};
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  bool up = false;
  for (int i = 0; i < 500 && !(up = a->Redis().up()); ++i) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(up);
}

TEST_F(RedisNodesTest, OnePlainRedisServerWorksAsTheTier) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(PlainRedis()));
  std::unique_ptr<Node> a = StartNode(), b = StartNode();
  const Prompt p = MakePrompt(17, 30);
  ASSERT_NO_FATAL_FAILURE(ComputeOn(*a, p, 0));
  const v1::CacheInfo got = AllocatePrompt(b->stub.get(), p.tokens);
  EXPECT_EQ(got.tier_loaded_tokens(), 16u);
  ASSERT_NO_FATAL_FAILURE(ExpectAsRecomputed(b->stub.get(), got, p, "fresh"));
}

TEST_F(RedisNodesTest, AWrongPasswordIsAClearMessageNeverACrash) {
  testing::RedisTestClusterOptions o = PlainRedis();
  o.server_args = {"--requirepass", "right"};
  o.cli_password = "right";
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  TempDir dir;
  const std::string file = dir.path() + "/password";
  std::ofstream(file) << "wrong\n";
  std::unique_ptr<Node> a = StartNode("", {"--tier_redis_password_file=" + file});
  const v1::CacheInfo got = AllocatePrompt(a->stub.get(), MakePrompt(9, 40).tokens);
  EXPECT_EQ(got.cached_tokens(), 0u);
  EXPECT_FALSE(a->Redis().up());
}

}  // namespace
}  // namespace kvarena
