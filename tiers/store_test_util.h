// Test-only helpers shared by the store tests: keys and values that name themselves, and
// a concurrent Get/Put/Erase stress any TierStore must pass.
#ifndef KVARENA_TIERS_STORE_TEST_UTIL_H_
#define KVARENA_TIERS_STORE_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "core/tier_store.h"
#include "gtest/gtest.h"

namespace kvarena {

// Key i: distinct keys whose hex differ in the first digits (so they spread over the
// disk store's fan-out directories).
inline ChunkKey TestKey(int i) {
  return ChunkKey{uint64_t(i) + 1, 0x9e3779b97f4a7c15ull * (uint64_t(i) + 1)};
}

// A value of `bytes` bytes that only key i, version `version` has.
inline std::string TestValue(int i, size_t bytes, int version = 0) {
  std::string v(bytes, '\0');
  for (size_t j = 0; j < bytes; ++j) v[j] = char(i * 7 + version * 101 + int(j) * 13 + int(j >> 8));
  return v;
}

// The size of key i's value in the stress test.
inline size_t StressBytes(int i) { return 100 + size_t(i % 7) * 37; }

// `threads` threads, each `ops` random Puts, Gets, Contains and Erases over `keys` keys
// (seeded from seed + thread), against a store too small for them all. Every Get that
// hits must return exactly the value Put under that key; at the end the usage must add
// up and be within the limit.
inline void RunConcurrentStress(TierStore* store, uint32_t seed, int threads = 4, int keys = 64,
                                int ops = 2000) {
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([=] {
      std::mt19937 rng(seed + uint32_t(t));
      for (int n = 0; n < ops; ++n) {
        const int i = int(rng() % uint32_t(keys));
        switch (rng() % 8) {
          case 0:
          case 1:
          case 2: {
            std::vector<EvictedChunk> evicted;
            const absl::Status s = store->Put(TestKey(i), TestValue(i, StressBytes(i)), &evicted);
            EXPECT_TRUE(s.ok()) << s;
            for (const EvictedChunk& e : evicted) {
              const int k = int(e.key.low) - 1;
              EXPECT_NE(k, i);
              EXPECT_EQ(e.value, TestValue(k, StressBytes(k))) << "evicted key " << k;
            }
            break;
          }
          case 7:
            store->Erase(TestKey(i));
            break;
          case 6:
            store->Contains(TestKey(i));
            break;
          default: {
            const absl::StatusOr<std::string> v = store->Get(TestKey(i), absl::InfiniteFuture());
            if (v.ok()) {
              EXPECT_EQ(*v, TestValue(i, StressBytes(i))) << "key " << i;
            } else {
              EXPECT_TRUE(absl::IsNotFound(v.status())) << v.status();
            }
          }
        }
      }
    });
  }
  for (std::thread& w : workers) w.join();
  const TierUsage u = store->Usage();
  EXPECT_LE(u.bytes_used, u.bytes_limit);
  uint64_t bytes = 0;
  int64_t chunks = 0;
  for (int i = 0; i < keys; ++i) {
    if (!store->Contains(TestKey(i))) continue;
    ++chunks;
    bytes += StressBytes(i);
    EXPECT_EQ(store->Get(TestKey(i), absl::InfiniteFuture()).value_or(""),
              TestValue(i, StressBytes(i)));
  }
  EXPECT_EQ(u.chunks, chunks);
  EXPECT_EQ(u.bytes_used, bytes);
}

}  // namespace kvarena

#endif  // KVARENA_TIERS_STORE_TEST_UTIL_H_
