// Test-only: the fixture of the Redis tier's process tests — a RedisTestCluster started per
// test, a RedisStore over it with short timeouts, a FakeClock a test may give the store
// (for its breakers and ttl accounting), and deterministic chunk keys and values.
#ifndef KVARENA_TESTS_REDIS_REDIS_FIXTURE_H_
#define KVARENA_TESTS_REDIS_REDIS_FIXTURE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "base/clock.h"
#include "gtest/gtest.h"
#include "tests/redis/redis_harness.h"
#include "tiers/redis/redis_store.h"

namespace kvarena::testing {

class RedisStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RedisInstalled()) {
      GTEST_SKIP() << "redis-server or redis-cli not installed (scripts/setup-deps installs "
                      "redis-server and redis-tools)";
    }
  }

  // Starts the processes; fails the test (ASSERT) when they do not come up.
  void StartCluster(const RedisTestClusterOptions& options = {}) {
    absl::StatusOr<std::unique_ptr<RedisTestCluster>> c = RedisTestCluster::Start(options);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
  }
  // Options with the test's short timeouts, seeded with every node of cluster_.
  RedisStoreOptions StoreOptions() const {
    RedisStoreOptions o;
    if (cluster_ != nullptr) o.seeds = cluster_->Seeds();
    o.connect_timeout = absl::Seconds(1);  // generous: a loaded 2-core machine
    o.command_timeout = absl::Seconds(1);
    o.breaker_period = absl::Milliseconds(200);
    return o;
  }
  std::unique_ptr<RedisStore> NewStore(const RedisStoreOptions& options) {
    absl::StatusOr<std::unique_ptr<RedisStore>> s = RedisStore::Create(options);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

 public:
  static ChunkKey Key(uint64_t i) { return {i * 0x9E3779B97F4A7C15ull + 1, ~i}; }
  // Bytes of every value, zeros among them, from i.
  static std::string Value(uint64_t i, size_t size = 600) {
    std::string v(size, '\0');
    for (size_t b = 0; b < size; ++b) v[b] = char((i * 131 + b * 7) % 251 * (b % 5 != 0));
    return v;
  }
  static absl::Time Deadline() { return absl::Now() + absl::Seconds(3); }
  // The port of the node the store routes key to.
  static int PortOf(RedisStore& store, const ChunkKey& key) {
    const std::string node = store.TEST_cluster().TEST_NodeForKey(store.RedisKey(key));
    return std::stoi(node.substr(node.rfind(':') + 1));
  }

 protected:
  std::unique_ptr<RedisTestCluster> cluster_;
  FakeClock clock_;  // the store's, where a test sets options.clock = &clock_
};

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_REDIS_REDIS_FIXTURE_H_
