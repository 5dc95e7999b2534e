// The identity of a prefix in the Redis tier (docs/redis-tier.md): node A, a kvarenad with
// tenants on one plain redis-server, computes a prompt in a quantized KV format (int8,
// fp8_e4m3 with non-unit static scales); node B, another kvarenad on the same server,
// takes none of it for a cache that differs in one identity field — KV format, one static
// scale, page size, kv heads, head_dim, layers, activation dtype, namespace, tenant —
// while the unchanged identity loads every full chunk, its K/V bit for bit A's: Redis
// holds the codes, never converted.
#include <memory>
#include <string>
#include <vector>

#include "tests/daemon/identity_kv.h"
#include "tests/redis/redis_harness.h"

namespace kvarena {
namespace {

using testing::PlainRedis;
using testing::RedisInstalled;
using testing::RedisTestCluster;

class RedisIdentityTest : public ::testing::TestWithParam<v1::KvFormat> {
 protected:
  void SetUp() override {
    if (!RedisInstalled()) GTEST_SKIP() << "redis-server or redis-cli is not installed";
    std::printf("prompt from fixed seed 8\n");
    auto c = RedisTestCluster::Start(PlainRedis());
    ASSERT_TRUE(c.ok()) << c.status();
    redis_ = *std::move(c);
  }

  // A kvarenad on the server, with tenants alice and bob.
  std::unique_ptr<DaemonProcess> StartNode() {
    auto node = std::make_unique<DaemonProcess>(std::vector<std::string>{
        "--arena_bytes=64Mi", "--tier_chunk_pages=2", "--tier_redis=" + redis_->Seeds(),
        "--tier_timeout=1500ms", IdentityTenantsFlag(files_)});
    EXPECT_TRUE(node->WaitServing(absl::Seconds(20))) << node->Log();
    return node;
  }

  // Waits (bounded) until the server holds `keys` keys.
  void WaitKeys(int keys) {
    std::string got;
    for (int i = 0; i < 500; ++i) {
      auto out = redis_->Cli(redis_->ports()[0], {"DBSIZE"});
      ASSERT_TRUE(out.ok()) << out.status();
      got = *out;
      if (std::atoi(got.c_str()) >= keys) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
    FAIL() << "redis never held " << keys << " keys: DBSIZE " << got;
  }

  TempDir files_;
  std::unique_ptr<RedisTestCluster> redis_;
};

TEST_P(RedisIdentityTest, NodeBTakesNodeAsPrefixOnlyUnderTheSameIdentityBitForBit) {
  const v1::CacheSpec base = IdentityBase(GetParam());
  const Prompt p = MakePrompt(17, 8);  // 4 full pages: 2 chunks of 2 pages
  std::unique_ptr<DaemonProcess> node_a = StartNode(), node_b = StartNode();
  auto a = v1::KvCacheService::NewStub(node_a->NewChannel());
  auto b = v1::KvCacheService::NewStub(node_b->NewChannel());
  const v1::CacheInfo computed = AllocateAs(a.get(), kIdentityAlice, base, p.tokens);
  ASSERT_NO_FATAL_FAILURE(ComputeAs(a.get(), kIdentityAlice, computed.cache_id(), p));
  const std::vector<std::string> want = KvBytesAs(a.get(), kIdentityAlice, computed.cache_id(), 16);
  ASSERT_NO_FATAL_FAILURE(WaitKeys(2));  // each full chunk goes to Redis as it fills
  ASSERT_NO_FATAL_FAILURE(ExpectFlipsMiss(b.get(), base, p.tokens));
  const v1::CacheInfo got = AllocateAs(b.get(), kIdentityAlice, base, p.tokens);
  EXPECT_EQ(got.cached_tokens(), 16u);
  EXPECT_EQ(got.tier_loaded_tokens(), 16u);
  ExpectSameKv(KvBytesAs(b.get(), kIdentityAlice, got.cache_id(), 16), want);
  if (HasFailure()) std::fprintf(stderr, "node B log:\n%s\n", node_b->Log().c_str());
}

INSTANTIATE_TEST_SUITE_P(Quantized, RedisIdentityTest, QuantizedKvFormats(), KvFormatParamName);

}  // namespace
}  // namespace kvarena
