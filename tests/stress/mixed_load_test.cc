// 8 worker processes x 8 threads of mixed operations against one kvarenad: served and
// local path, sliding windows and max_tokens caches, shared-slice tensors in half the
// processes (inline in the others). Every worker checks its own results; the test then
// checks the arena as a whole while every worker holds its caches: the pages the caches
// hold are exactly the pages the pools count as used, and no page has two owners. After
// every worker released and exited, nothing is left.
//
// $KVARENA_STRESS_OPS sets the operations per thread (default 100; scripts/soak.sh: more).
#include <signal.h>

#include <iostream>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/stress/stress_fixture.h"

namespace kvarena::testing {
namespace {

constexpr int kWorkers = 8, kThreads = 8;

class MixedLoadTest : public StressTest {};

TEST_F(MixedLoadTest, EightProcessesByEightThreadsKeepEveryPageAccountedFor) {
  const int64_t ops = EnvCount("KVARENA_STRESS_OPS", 100);
  // No warm chunks: every empty pool is destroyed at the end (below).
  StartDaemonWith({"--session_grace=200ms", "--scratch_bytes=4Mi", "--arena_warm_bytes=0"});
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int i = 0; i < kWorkers; ++i) {
    std::vector<std::string> flags = {"--mode=mixed", "--hold",
                                      absl::StrCat("--threads=", kThreads),
                                      absl::StrCat("--ops=", ops)};
    if (i % 2 == 1) flags.push_back("--inline_tensors");
    workers.push_back(StartStressWorker(uint64_t(i), flags));
  }
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_NO_FATAL_FAILURE(ExpectLine(*workers[size_t(i)], "holding", absl::StrCat("worker ", i)));
  }

  // Every worker is paused holding its caches: the arena must add up.
  std::map<std::pair<uint64_t, int32_t>, std::string> owner;  // (pool, page) -> cache
  std::map<uint64_t, int64_t> pool_pages;
  std::set<std::string> held_ids;
  for (auto& w : workers) {
    for (const HeldCache& c : ParseHeldCaches(w->output())) {
      held_ids.insert(c.cache_id);
      pool_pages[c.pool_id] += int64_t(c.pages.size());
      for (int32_t page : c.pages) {
        auto [it, fresh] = owner.emplace(std::pair(c.pool_id, page), c.cache_id);
        EXPECT_TRUE(fresh) << "page " << page << " of pool " << c.pool_id << " held by "
                           << it->second << " and " << c.cache_id;
      }
      auto cs = Observer()->CacheStats(c.cache_id);
      ASSERT_TRUE(cs.ok()) << cs.status();
      EXPECT_EQ(cs->pages_used, int64_t(c.pages.size())) << c.cache_id;
    }
  }
  auto st = Observer()->Stats();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->pages.pages_used, int64_t(owner.size()));
  EXPECT_EQ(st->num_caches, int64_t(held_ids.size()));
  EXPECT_EQ(st->num_sessions, kWorkers);
  for (const PoolStats& p : st->pools) {
    EXPECT_EQ(p.pages_used, pool_pages[p.pool_id]) << "pool " << p.pool_id;
  }
  EXPECT_EQ(st->pools.size(), pool_pages.size()) << "a pool no held cache draws from";
  auto listed = Observer()->ListCaches();
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::set<std::string> listed_ids;
  for (const CacheInfo& c : *listed) listed_ids.insert(c.cache_id);
  EXPECT_EQ(listed_ids, held_ids);
  const int64_t pages_held = st->pages.pages_used;

  Report total;
  for (int i = 0; i < kWorkers; ++i) {
    workers[size_t(i)]->Signal(SIGUSR1);
    ExpectExitsOk(*workers[size_t(i)], absl::StrCat("worker ", i), StressBound());
    AddReport(ParseReports(workers[size_t(i)]->output(), "report"), &total);
  }
  EXPECT_EQ(total["ops"], kWorkers * kThreads * ops) << FormatReport(total);
  const std::string summary =
      absl::StrCat(kWorkers, " processes x ", kThreads, " threads x ", ops,
                   " ops: ", FormatReport(total), "; held at the pause: ", held_ids.size(),
                   " caches, ", pages_held, " pages in ", st->pools.size(), " pools");
  std::cout << "mixed load: " << summary << std::endl;
  RecordProperty("mixed_load", summary);

  ExpectArenaEmpty("after every worker exited");
  auto end = Observer()->Stats();
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->pools.size(), 0u) << "empty pools are destroyed";
  EXPECT_EQ(end->bytes_committed, 0u);
}

}  // namespace
}  // namespace kvarena::testing
