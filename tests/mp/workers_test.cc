// Real worker processes against one real kvarenad: concurrent correctness, and a worker
// killed mid-decode gets its pages back to the arena after --session_grace. Workers that
// must be somewhere while the test looks are paused there (--pause_after_prefill) rather
// than hoped to be slow enough.
#include <signal.h>

#include <algorithm>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/mp/mp_fixture.h"

namespace kvarena::testing {
namespace {

class WorkersTest : public MultiProcessTest {
 protected:
  // Pages held by the pools whose head_dim is (or is not) head_dim.
  int64_t PoolPages(int head_dim, bool matching) {
    auto st = Observer()->Stats();
    EXPECT_TRUE(st.ok()) << st.status();
    int64_t pages = 0;
    if (!st.ok()) return -1;
    for (const PoolStats& p : st->pools) {
      if ((p.layout.head_dim == head_dim) == matching) pages += p.pages_used;
    }
    return pages;
  }
};

TEST_F(WorkersTest, FourConcurrentWorkersMatchReferenceAndFreeEverything) {
  StartDaemon();
  const std::vector<std::string> common = {"--decode=96", "--pause_after_prefill"};
  std::vector<std::vector<std::string>> flags = {
      {"--dtype=float32", "--head_dim=64"},
      {"--dtype=float16", "--window=8", "--head_dim=64"},
      {"--dtype=bfloat16", "--kv_heads=1", "--q_heads=4", "--head_dim=128", "--page_size=8"},
      {"--dtype=float16", "--kv_heads=2", "--q_heads=8", "--head_dim=64", "--prefill=40"}};
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (size_t i = 0; i < flags.size(); ++i) {
    flags[i].insert(flags[i].end(), common.begin(), common.end());
    workers.push_back(StartWorker(i + 1, flags[i]));
  }
  // They really share the arena at once: every one holds its prefilled cache, paused,
  // until all four are there; then they decode side by side.
  for (auto& w : workers) {
    ASSERT_TRUE(w->WaitForOutput("paused after prefill", kEventBound)) << w->output();
  }
  auto held = Observer()->Stats();
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->num_caches, 4);
  EXPECT_EQ(held->num_sessions, 4);
  EXPECT_GT(held->pages.pages_used, 0);
  for (auto& w : workers) w->Signal(SIGUSR1);
  for (size_t i = 0; i < workers.size(); ++i) {
    ExpectExitsOk(*workers[i], absl::StrCat("worker ", i + 1));
    if (i != 1) {  // worker 2 has sliding layers: popn may refuse there
      EXPECT_NE(workers[i]->output().find("popn ok"), std::string::npos) << workers[i]->output();
    }
  }
  auto st = Observer()->Stats();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->pages.pages_used, 0);
  EXPECT_EQ(st->num_caches, 0);
}

// The other two workers stay paused after their prefill, holding their pages, from before
// the kill until the check is done: the arena's state at each step is fixed by the test,
// not by how fast the workers run. (The grace itself is shown to hold pages in
// tests/daemon/session_test.cc, with a grace that cannot run out meanwhile.)
TEST_F(WorkersTest, KilledWorkerPagesFreedAfterSessionGrace) {
  StartDaemon("1s");
  // The victim has its own geometry (head_dim 32), hence its own pool.
  auto victim =
      StartWorker(7, {"--head_dim=32", "--decode=100000", "--step_delay_ms=5", "--print_every=4"});
  std::vector<std::unique_ptr<Subprocess>> others;
  others.push_back(StartWorker(8, {"--decode=250", "--pause_after_prefill"}));
  others.push_back(StartWorker(9, {"--decode=250", "--window=8", "--pause_after_prefill"}));

  ASSERT_TRUE(victim->WaitForOutput("decode step", kEventBound)) << victim->output();
  for (auto& o : others) {
    ASSERT_TRUE(o->WaitForOutput("paused after prefill", kEventBound)) << o->output();
  }
  std::smatch m;
  const std::string out = victim->output();
  ASSERT_TRUE(std::regex_search(out, m, std::regex("allocated cache (\\S+)"))) << out;
  const std::string victim_cache = m[1];
  ASSERT_GT(PoolPages(32, true), 0);
  auto before = Observer()->Stats();
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->num_sessions, 3);

  victim->Signal(SIGKILL);
  auto status = victim->Wait(kEventBound);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(DescribeWaitStatus(*status), "signal 9 (Killed)");

  // Once the grace ran out the victim's pool is empty, its cache and session are gone,
  // and the arena's pages are exactly what the other workers' pools hold.
  const bool freed = WaitForArena([&](const ArenaStats& st) {
    return st.num_sessions == 2 && PoolPages(32, true) == 0 &&
           Observer()->CacheStats(victim_cache).status().code() == absl::StatusCode::kNotFound;
  });
  ASSERT_TRUE(freed) << "victim pool still holds " << PoolPages(32, true) << " pages";
  auto after = Observer()->Stats();
  ASSERT_TRUE(after.ok());
  int64_t others_pages = 0;
  for (const PoolStats& p : after->pools) {
    if (p.layout.head_dim != 32) others_pages += p.pages_used;
  }
  EXPECT_EQ(after->pages.pages_used, others_pages);
  EXPECT_GT(others_pages, 0) << "the other workers hold their prefilled caches";
  EXPECT_EQ(after->num_caches, 2);

  for (size_t i = 0; i < others.size(); ++i) {
    others[i]->Signal(SIGUSR1);
    ExpectExitsOk(*others[i], absl::StrCat("worker ", i + 8));
  }
  EXPECT_EQ(WaitForArenaPages([](int64_t p) { return p == 0; }), 0);
}

// Local path through the real daemon: 300 decode tokens over 4 layers (odd layers sliding)
// equal the served path's bit for bit (the worker checks), get_kv equals what was written,
// and the decode makes at most ceil(300 / page_size) Reserve RPCs.
TEST_F(WorkersTest, LocalPathDecodeMatchesServedPathWithFewReserves) {
  StartDaemon();
  auto w = StartWorker(21, {"--local", "--layers=4", "--decode=300", "--window=24",
                            "--dtype=float16", "--print_every=100"});
  ExpectExitsOk(*w, "local worker");
  const std::string out = w->output();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("reserve_calls (\\d+) commit_calls (\\d+)")))
      << out;
  EXPECT_LE(std::stoi(m[1]), (300 + 15) / 16) << out;
  EXPECT_EQ(std::stoi(m[2]), 300 + 3) << out;  // one per step, and the 3 re-appended after popn
  EXPECT_NE(out.find("popn ok"), std::string::npos) << out;
  EXPECT_EQ(WaitForArenaPages([](int64_t p) { return p == 0; }), 0);
}

// A local-path worker holds a mapping of the pool and pages reserved ahead of its tokens
// when it is killed: they all come back once --session_grace ran out.
TEST_F(WorkersTest, KilledLocalPathWorkerLeaksNoPages) {
  StartDaemon("1s");
  const int64_t before = WaitForArenaPages([](int64_t) { return true; });
  auto victim = StartWorker(22, {"--local", "--layers=4", "--decode=100000", "--step_delay_ms=5",
                                 "--print_every=4", "--reserve_ahead=64"});
  ASSERT_TRUE(victim->WaitForOutput("decode step", kEventBound)) << victim->output();
  std::smatch m;
  const std::string out = victim->output();
  ASSERT_TRUE(std::regex_search(out, m, std::regex("allocated cache (\\S+)"))) << out;
  const std::string cache = m[1];
  // Reserved ahead: more pages than its committed tokens fill (4 global layers, page 16).
  bool ahead = false;
  for (const absl::Time deadline = absl::Now() + kEventBound; !ahead && absl::Now() < deadline;) {
    auto st = Observer()->CacheStats(cache);
    ASSERT_TRUE(st.ok()) << st.status();
    ahead = st->pages_used > 4 * ((st->seq_len + 15) / 16);
    if (!ahead) absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(ahead);

  victim->Signal(SIGKILL);
  ASSERT_TRUE(victim->Wait(kEventBound).ok());
  EXPECT_EQ(WaitForArenaPages([&](int64_t p) { return p == before; }), before);
  EXPECT_EQ(Observer()->CacheStats(cache).status().code(), absl::StatusCode::kNotFound);
}

// The same worker binary against the in-process arena: the handle API is one API.
TEST_F(WorkersTest, WorkerRunsAgainstInproc) {
  auto r = RunCommand(
      {KVARENA_WORKER_PATH, "--address=inproc:", "--window=8", "--decode=40", "--dtype=bfloat16"},
      absl::Seconds(60));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->exited_ok()) << r->output;
  EXPECT_NE(r->output.find("worker ok"), std::string::npos) << r->output;
}

TEST_F(WorkersTest, LocalPathWorkerRunsAgainstInproc) {
  auto r = RunCommand({KVARENA_WORKER_PATH, "--address=inproc:", "--local", "--window=24",
                       "--decode=60", "--dtype=bfloat16"},
                      absl::Seconds(60));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->exited_ok()) << r->output;
  EXPECT_NE(r->output.find("local path:"), std::string::npos) << r->output;
}

}  // namespace
}  // namespace kvarena::testing
