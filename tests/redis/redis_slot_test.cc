#include "tiers/redis/redis_slot.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/status_matchers.h"
#include "tiers/redis/redis_store.h"

namespace kvarena {
namespace {

using ::kvarena::testing::StatusIs;

TEST(RedisSlotTest, Crc16IsXmodem) {
  EXPECT_EQ(RedisCrc16("123456789"), 0x31C3);  // the Redis Cluster specification's check
  EXPECT_EQ(RedisCrc16(""), 0);
}

TEST(RedisSlotTest, KeySlotsMatchRedis) {
  // CLUSTER KEYSLOT answers of redis-server 7.0.
  EXPECT_EQ(RedisKeySlot("foo"), 12182);
  EXPECT_EQ(RedisKeySlot("bar"), 5061);
  EXPECT_EQ(RedisKeySlot("kva:{00000000000000000000000000000000}"),
            RedisKeySlot("0000000000000000"
                         "0000000000000000"));
}

TEST(RedisSlotTest, HashTagsAsTheSpecification) {
  EXPECT_EQ(RedisKeySlot("{user1000}.following"), RedisKeySlot("{user1000}.followers"));
  EXPECT_EQ(RedisKeySlot("{user1000}.following"), RedisKeySlot("user1000"));
  EXPECT_EQ(RedisKeySlot("foo{}{bar}"), RedisCrc16("foo{}{bar}") % kRedisSlots);  // empty tag
  EXPECT_EQ(RedisKeySlot("foo{{bar}}zap"), RedisKeySlot("{bar"));
  EXPECT_EQ(RedisKeySlot("foo{bar}{zap}"), RedisKeySlot("bar"));
  EXPECT_EQ(RedisKeySlot("foo{bar"), RedisCrc16("foo{bar") % kRedisSlots);  // no closing
}

TEST(RedisSlotTest, AddressesParse) {
  absl::StatusOr<RedisAddress> a = ParseRedisAddress("10.0.0.1:7000", "seeds");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "10.0.0.1");
  EXPECT_EQ(a->port, 7000);
  a = ParseRedisAddress("[::1]:6379", "seeds");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->ToString(), "[::1]:6379");
  for (const char* bad : {"", "host", ":6379", "host:", "host:0", "host:65536", "host:x"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(ParseRedisAddress(bad, "seeds"),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("seeds=")));
  }
}

TEST(RedisStoreOptionsTest, InvalidOptionsAreRefusedByName) {
  struct Case {
    const char* field;
    RedisStoreOptions options;
  };
  RedisStoreOptions base;
  base.seeds = "127.0.0.1:1";
  std::vector<Case> cases = {{"seeds", base},      {"seeds", base}, {"key_prefix", base},
                             {"key_prefix", base}, {"ttl", base},   {"command_timeout", base},
                             {"clock", base}};
  cases[0].options.seeds = "";
  cases[1].options.seeds = "127.0.0.1:1,nohost";
  cases[2].options.key_prefix = "";
  cases[3].options.key_prefix = "a{b";
  cases[4].options.ttl = absl::Seconds(-1);
  cases[5].options.command_timeout = absl::ZeroDuration();
  cases[6].options.clock = nullptr;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    EXPECT_THAT(RedisStore::Create(c.options),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr(c.field)));
  }
}

}  // namespace
}  // namespace kvarena
