// RedisStore against real redis-server processes: a 3+3 Redis Cluster and a plain server.
#include <algorithm>
#include <random>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "tests/redis/garbage_server.h"
#include "tests/redis/redis_fixture.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_seed.h"

namespace kvarena::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(RedisStoreTest, PutGetAcrossManyKeysAndSlots) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::unique_ptr<RedisStore> store = NewStore(StoreOptions());
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->Usage().up);
  EXPECT_EQ(store->medium(), "redis");
  std::mt19937_64 rng(TestSeed());
  std::vector<uint64_t> ids(300);
  std::set<int> nodes;
  uint64_t bytes = 0;
  for (uint64_t& id : ids) {
    id = rng();
    const std::string value = Value(id, 100 + id % 2000);
    ASSERT_THAT(store->Put(Key(id), value, nullptr), IsOk());
    nodes.insert(PortOf(*store, Key(id)));
    bytes += value.size();
  }
  EXPECT_EQ(nodes.size(), 3u) << "the keys span every primary";
  for (uint64_t id : ids) {
    absl::StatusOr<std::string> got = store->Get(Key(id), Deadline());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, Value(id, 100 + id % 2000));
    EXPECT_TRUE(store->Contains(Key(id)));
  }
  EXPECT_EQ(store->Usage().chunks, int64_t(ids.size()));
  EXPECT_EQ(store->Usage().bytes_used, bytes);

  // Content-addressed: a chunk already there is not sent again.
  ASSERT_THAT(store->Put(Key(ids[0]), Value(ids[0], 100 + ids[0] % 2000), nullptr), IsOk());
  EXPECT_EQ(store->already_present(), 1);

  // Many keys at once: one pipeline per node, answers in order, a missing one in between.
  std::vector<ChunkKey> keys;
  for (uint64_t id : ids) keys.push_back(Key(id));
  keys.insert(keys.begin() + 7, Key(~uint64_t{0}));
  std::vector<absl::StatusOr<std::string>> values = store->GetMany(keys, Deadline());
  ASSERT_EQ(values.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i == 7) {
      EXPECT_THAT(values[i], StatusIs(absl::StatusCode::kNotFound));
      continue;
    }
    ASSERT_TRUE(values[i].ok()) << values[i].status();
    const uint64_t id = ids[i < 7 ? i : i - 1];
    EXPECT_EQ(*values[i], Value(id, 100 + id % 2000));
  }

  store->Erase(Key(ids[1]));
  EXPECT_THAT(store->Get(Key(ids[1]), Deadline()), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(store->Contains(Key(ids[1])));
  EXPECT_EQ(store->Usage().chunks, int64_t(ids.size()) - 1);
  const RedisCounterValues c = store->cluster_counters();
  EXPECT_EQ(c.errors, 0);
  EXPECT_EQ(c.moved, 0);
}

TEST_F(RedisStoreTest, PlainRedisServerWorks) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(PlainRedis()));
  RedisStoreOptions options = StoreOptions();
  options.key_prefix = "plain";
  options.ttl = absl::Seconds(60);
  std::unique_ptr<RedisStore> store = NewStore(options);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->Usage().up);
  EXPECT_FALSE(store->TEST_cluster().cluster_mode());
  for (uint64_t i = 0; i < 50; ++i) ASSERT_THAT(store->Put(Key(i), Value(i), nullptr), IsOk());
  for (uint64_t i = 0; i < 50; ++i) {
    absl::StatusOr<std::string> got = store->Get(Key(i), Deadline());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, Value(i));
  }
  // SET carried PX; a Get renews it (GETEX), and so does a Put of a chunk already there.
  const int port = cluster_->ports()[0];
  auto pttl = [&](uint64_t i) {
    absl::StatusOr<std::string> ms = cluster_->Cli(port, {"PTTL", store->RedisKey(Key(i))});
    EXPECT_TRUE(ms.ok()) << ms.status();
    return ms.ok() ? std::stoll(*ms) : -3;
  };
  EXPECT_GT(pttl(3), 10000);
  ASSERT_TRUE(cluster_->Cli(port, {"PEXPIRE", store->RedisKey(Key(3)), "5000"}).ok());
  ASSERT_TRUE(cluster_->Cli(port, {"PEXPIRE", store->RedisKey(Key(4)), "5000"}).ok());
  EXPECT_LE(pttl(3), 5000);
  EXPECT_EQ(store->Get(Key(3), Deadline()).value_or("<error>"), Value(3));
  EXPECT_GT(pttl(3), 10000);
  ASSERT_THAT(store->Put(Key(4), Value(4), nullptr), IsOk());
  EXPECT_EQ(store->already_present(), 1);
  EXPECT_GT(pttl(4), 10000);
  EXPECT_TRUE(absl::StartsWith(store->RedisKey(Key(3)), "plain:{"));
  store->Erase(Key(3));
  EXPECT_THAT(store->Get(Key(3), Deadline()), StatusIs(absl::StatusCode::kNotFound));
}

// A new chunk is one SET ... NX PX (no EXISTS or PEXPIRE before it); a key holding a value
// of another Redis type reads as DATA_LOSS, and once erased the chunk is written again.
TEST_F(RedisStoreTest, ANewChunkIsOneSetAndAWrongTypeKeyIsDataLoss) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(PlainRedis()));
  RedisStoreOptions options = StoreOptions();
  options.ttl = absl::Seconds(60);
  std::unique_ptr<RedisStore> store = NewStore(options);
  ASSERT_NE(store, nullptr);
  const int port = cluster_->ports()[0];
  ASSERT_TRUE(cluster_->Cli(port, {"CONFIG", "RESETSTAT"}).ok());
  for (uint64_t i = 0; i < 10; ++i) ASSERT_THAT(store->Put(Key(i), Value(i), nullptr), IsOk());
  absl::StatusOr<std::string> stats = cluster_->Cli(port, {"INFO", "commandstats"});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_THAT(*stats, HasSubstr("cmdstat_set:calls=10,"));
  EXPECT_THAT(*stats, ::testing::Not(HasSubstr("cmdstat_exists:")));
  EXPECT_THAT(*stats, ::testing::Not(HasSubstr("cmdstat_pexpire:")));

  const std::string k = store->RedisKey(Key(42));
  ASSERT_TRUE(cluster_->Cli(port, {"HSET", k, "field", "value"}).ok());
  EXPECT_THAT(store->Get(Key(42), Deadline()), StatusIs(absl::StatusCode::kDataLoss));
  store->Erase(Key(42));
  ASSERT_THAT(store->Put(Key(42), Value(42), nullptr), IsOk());
  EXPECT_EQ(store->Get(Key(42), Deadline()).value_or("<error>"), Value(42));
}

// What the ttl expired leaves Usage's figures without a Get of it, as the store's clock
// passes the ttl: Redis, on its own clock, still holds the chunks (the ttl is long), but
// the store never counts one past its expiry. A Get renews the expiry, as it renews it
// in Redis.
TEST_F(RedisStoreTest, UsageForgetsWhatTheTtlExpired) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(PlainRedis()));
  RedisStoreOptions options = StoreOptions();
  options.ttl = absl::Seconds(600);
  options.clock = &clock_;
  std::unique_ptr<RedisStore> store = NewStore(options);
  ASSERT_NE(store, nullptr);
  for (uint64_t i = 0; i < 20; ++i) ASSERT_THAT(store->Put(Key(i), Value(i), nullptr), IsOk());
  EXPECT_EQ(store->Usage().chunks, 20);
  EXPECT_EQ(store->Usage().bytes_used, 20 * Value(0).size());

  clock_.Advance(absl::Seconds(300));
  ASSERT_EQ(store->Get(Key(0), Deadline()).value_or("<error>"), Value(0));  // renewed
  clock_.Advance(absl::Seconds(300) - absl::Nanoseconds(1));
  EXPECT_EQ(store->Usage().chunks, 20) << "a nanosecond before the ttl";
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(store->Usage().chunks, 1) << "the ttl is over for all but the renewed one";
  EXPECT_EQ(store->Usage().bytes_used, Value(0).size());

  const int port = cluster_->ports()[0];
  std::vector<std::string> exists = {"EXISTS"};
  for (uint64_t i = 0; i < 20; ++i) exists.push_back(store->RedisKey(Key(i)));
  EXPECT_EQ(absl::StripAsciiWhitespace(cluster_->Cli(port, exists).value_or("?")), "20")
      << "Redis expires on its own clock, which has not moved";

  clock_.Advance(absl::Seconds(300));
  EXPECT_EQ(store->Usage().chunks, 0);
  EXPECT_EQ(store->Usage().bytes_used, 0u);
  // A chunk read again is counted again, until its renewed ttl.
  ASSERT_EQ(store->Get(Key(5), Deadline()).value_or("<error>"), Value(5));
  EXPECT_EQ(store->Usage().chunks, 1);
  clock_.Advance(options.ttl);
  EXPECT_EQ(store->Usage().chunks, 0);
}

TEST_F(RedisStoreTest, GarbageValuesAreReturnedAsBytes) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(PlainRedis()));
  std::unique_ptr<RedisStore> store = NewStore(StoreOptions());
  ASSERT_NE(store, nullptr);
  ASSERT_THAT(store->Put(Key(1), Value(1), nullptr), IsOk());
  // Someone else overwrites the chunk: the store hands the bytes on as they are (the tier
  // manager's verification rejects them), and an empty value is a value too.
  ASSERT_TRUE(
      cluster_->Cli(cluster_->ports()[0], {"SET", store->RedisKey(Key(1)), "garbage"}).ok());
  ASSERT_TRUE(cluster_->Cli(cluster_->ports()[0], {"SET", store->RedisKey(Key(2)), ""}).ok());
  EXPECT_EQ(store->Get(Key(1), Deadline()).value_or("<error>"), "garbage");
  EXPECT_EQ(store->Get(Key(2), Deadline()).value_or("<error>"), "");
  // A key of another type: DATA_LOSS (the tier erases it), not a crash.
  ASSERT_TRUE(cluster_->Cli(cluster_->ports()[0], {"RPUSH", store->RedisKey(Key(3)), "x"}).ok());
  EXPECT_THAT(store->Get(Key(3), Deadline()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("WRONGTYPE")));
}

// Against GarbageServer: no redis-server needed.
class ScriptedRedisTest : public RedisStoreTest {
 protected:
  void SetUp() override {}
};

TEST_F(ScriptedRedisTest, GarbageRepliesAreErrorsNeverCrashes) {
  struct Case {
    const char* reply;
    absl::StatusCode get;
  };
  const Case cases[] = {
      {":7\r\n", absl::StatusCode::kInternal},             // an integer where a string belongs
      {"*1\r\n$1\r\nx\r\n", absl::StatusCode::kInternal},  // an array
      {"%%garbage\r\n", absl::StatusCode::kUnavailable},   // not the protocol at all
      {"$99999999999\r\n", absl::StatusCode::kDeadlineExceeded},  // waits for 93 GiB
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.reply);
    GarbageServer server(c.reply);
    RedisStoreOptions options = StoreOptions();
    options.seeds = "127.0.0.1:" + std::to_string(server.port());
    std::unique_ptr<RedisStore> store = NewStore(options);
    ASSERT_NE(store, nullptr);
    EXPECT_THAT(store->Get(Key(1), Deadline()), StatusIs(c.get));
    EXPECT_FALSE(store->Put(Key(1), "v", nullptr).ok());
    EXPECT_FALSE(store->Contains(Key(1)));
    store->Erase(Key(1));
    EXPECT_FALSE(store->last_error().empty());
  }
}

TEST_F(ScriptedRedisTest, RedirectsAreBoundedAndRetriesEndAtTheDeadline) {
  GarbageServer server("");
  const std::string self = "127.0.0.1:" + std::to_string(server.port());
  RedisStoreOptions options = StoreOptions();
  options.seeds = self;
  std::unique_ptr<RedisStore> store = NewStore(options);
  ASSERT_NE(store, nullptr);

  // A node that redirects forever: followed 5 times, then an error naming the last one.
  for (const char* redirect : {"MOVED", "ASK"}) {
    SCOPED_TRACE(redirect);
    server.set_reply(absl::StrCat("-", redirect, " 42 ", self, "\r\n"));
    EXPECT_THAT(store->Get(Key(1), Deadline()),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("more than 5 redirects")));
  }
  EXPECT_EQ(store->cluster_counters().moved, 5);
  EXPECT_EQ(store->cluster_counters().ask, 5);

  // Busy answers are backed off and retried until the deadline.
  for (const char* busy : {"TRYAGAIN Multiple keys request during rehashing of slot",
                           "CLUSTERDOWN The cluster is down", "LOADING Redis is loading"}) {
    SCOPED_TRACE(busy);
    server.set_reply(absl::StrCat("-", busy, "\r\n"));
    const int64_t before = store->cluster_counters().retries;
    EXPECT_THAT(store->Get(Key(1), absl::Now() + absl::Milliseconds(600)),
                StatusIs(absl::StatusCode::kDeadlineExceeded));
    EXPECT_GE(store->cluster_counters().retries, before + 2);
  }
  // Other errors are the answer, not retried.
  server.set_reply("-OOM command not allowed when used memory > 'maxmemory'.\r\n");
  EXPECT_THAT(store->Put(Key(1), "v", nullptr), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(store->last_error(), HasSubstr("OOM"));
}

TEST_F(RedisStoreTest, UnreachableAtStartThenComesUp) {
  RedisTestClusterOptions options = ClusterOf(3, 0);
  for (int i = 0; i < 3; ++i) {
    int port;
    do port = PickRedisPort();
    while (std::find(options.ports.begin(), options.ports.end(), port) != options.ports.end());
    options.ports.push_back(port);
  }
  RedisStoreOptions store_options = StoreOptions();
  for (int port : options.ports) {
    store_options.seeds +=
        (store_options.seeds.empty() ? "" : ",") + ("127.0.0.1:" + std::to_string(port));
  }
  std::unique_ptr<RedisStore> store = NewStore(store_options);
  ASSERT_NE(store, nullptr) << "an unreachable cluster does not stop the store";
  EXPECT_FALSE(store->Usage().up);
  EXPECT_THAT(store->Get(Key(1), Deadline()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no slot map")));
  EXPECT_THAT(store->Put(Key(1), Value(1), nullptr), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(store->last_error(), HasSubstr("refused"));

  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  // The store loads the slot map by itself (a map read while `--cluster create` was still
  // assigning slots may miss some owners for a moment: then the next refresh has them).
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  absl::Status put = absl::UnknownError("not tried");
  while (!put.ok() && absl::Now() < give_up) {
    put = store->Put(Key(1), Value(1), nullptr);
    if (!put.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_THAT(put, IsOk());
  EXPECT_TRUE(store->Usage().up);
  EXPECT_EQ(store->Get(Key(1), Deadline()).value_or("<error>"), Value(1));
}

TEST_F(RedisStoreTest, WrongPasswordIsAClearErrorNeverACrash) {
  RedisTestClusterOptions options = PlainRedis();
  // alice: the ACL user docs/redis-tier.md recommends, limited to the tier's keys.
  options.server_args = {"--requirepass",  "right",  "--user", "alice",   "on",
                         ">alicepw",       "~kva:*", "+@read", "+@write", "+@connection",
                         "+cluster|slots", "+asking"};
  options.cli_password = "right";
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  struct Case {
    const char* user;
    const char* password;
    const char* message;  // "" : works
  };
  const Case cases[] = {
      {"", "wrong", "WRONGPASS"},      {"", "", "NOAUTH"}, {"alice", "wrong", "WRONGPASS"},
      {"bob", "alicepw", "WRONGPASS"}, {"", "right", ""},  {"alice", "alicepw", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.user) + "/" + c.password);
    RedisStoreOptions options = StoreOptions();
    options.user = c.user;
    options.password = c.password;
    std::unique_ptr<RedisStore> store = NewStore(options);
    ASSERT_NE(store, nullptr);
    if (*c.message == '\0') {
      ASSERT_THAT(store->Put(Key(7), Value(7), nullptr), IsOk());
      EXPECT_EQ(store->Get(Key(7), Deadline()).value_or("<error>"), Value(7));
      continue;
    }
    EXPECT_FALSE(store->Usage().up);
    EXPECT_THAT(store->Put(Key(7), Value(7), nullptr),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr(c.message)));
    EXPECT_THAT(store->Get(Key(7), Deadline()),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr(c.message)));
    EXPECT_THAT(store->last_error(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace kvarena::testing
