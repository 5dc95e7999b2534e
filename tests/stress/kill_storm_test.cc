// Kill storm: cycles of worker processes SIGKILLed at seeded random points — while
// connecting (Attach, fd socket, scratch mapping), while allocating (a new pool's fds on
// their way), holding a mapping and reserved pages, or deep in their operations (mid-RPC).
// After each cycle every page, cache and session comes back once the grace runs out; after
// the storm the daemon's open fds are back to their count before it and its RSS within
// kRssToleranceKiB of what it was after the first cycle.
//
// $KVARENA_KILL_CYCLES sets the cycles (default 20; scripts/soak.sh: 100).
#include <signal.h>

#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/stress/stress_fixture.h"

namespace kvarena::testing {
namespace {

constexpr int kVictimsPerCycle = 3;
// The RSS growth allowed over the storm, from the end of the first cycle (which pays once
// for what the daemon keeps for later connections: gRPC's per-thread and per-connection
// allocations, glibc malloc arenas of its handler threads, their stacks). Measured on the
// 2-vCPU dev VM: up to +0.9 MiB in cycle 1, then +1.0-1.6 MiB after 20 cycles, +1.8 after
// 100 and +1.75 after 300 — a plateau (allocator caches), not a per-cycle cost. A scratch
// region (2 MiB here) or pool chunk (2 MiB) leaked with its pages touched in a few cycles
// goes past it; one leaked untouched still holds its memfd open, which the fd check sees.
constexpr int64_t kRssToleranceKiB = 8 * 1024;

// Where a victim is killed: after this line (or just after it started) plus a delay.
struct KillPoint {
  const char* after;  // nullptr: counted from the start of the process
  const char* name;
};
constexpr KillPoint kKillPoints[] = {{nullptr, "connecting"},
                                     {"phase attached", "allocating"},
                                     {"phase reserved", "holding reserved pages"},
                                     {"phase running", "mid-operation"}};

class KillStormTest : public StressTest {};

TEST_F(KillStormTest, EveryPageFdAndByteComesBackAfterKilledWorkers) {
  const int64_t cycles = EnvCount("KVARENA_KILL_CYCLES", 20);
  // No warm chunks: a pool that keeps them (--arena_warm_bytes) stays alive with its memfd
  // open after the storm, one fd over the baseline whenever the last cycle left it some.
  StartDaemonWith({"--session_grace=100ms", "--scratch_bytes=2Mi", "--arena_warm_bytes=0"});
  ASSERT_TRUE(Observer()->Stats().ok());  // its connection is part of the baseline
  const int fds_before = DaemonFds();
  const int64_t rss_before = DaemonRssKiB();
  std::mt19937_64 rng(seed_);
  std::vector<int64_t> kills_at(std::size(kKillPoints), 0);
  int64_t rss_after_first = -1;

  for (int64_t cycle = 0; cycle < cycles; ++cycle) {
    SCOPED_TRACE(absl::StrCat("cycle ", cycle));
    std::vector<std::unique_ptr<Subprocess>> victims;
    std::vector<size_t> points;
    std::vector<absl::Time> started;
    for (int v = 0; v < kVictimsPerCycle; ++v) {
      points.push_back(std::uniform_int_distribution<size_t>(0, std::size(kKillPoints) - 1)(rng));
      victims.push_back(StartStressWorker(uint64_t(cycle * kVictimsPerCycle + v),
                                          {"--mode=victim", "--threads=2"}));
      started.push_back(absl::Now());
    }
    for (int v = 0; v < kVictimsPerCycle; ++v) {
      Subprocess& victim = *victims[size_t(v)];
      const KillPoint& point = kKillPoints[points[size_t(v)]];
      // A delay, not an assertion: where in its work the victim is when the signal lands.
      const absl::Duration delay =
          absl::Microseconds(std::uniform_int_distribution<int>(0, 20000)(rng));
      if (point.after != nullptr) {
        ASSERT_TRUE(victim.WaitForOutput(point.after, StressBound())) << victim.output();
        absl::SleepFor(delay);
      } else {
        absl::SleepFor(started[size_t(v)] + delay - absl::Now());
      }
      ASSERT_EQ(victim.output().find("FAILED"), std::string::npos) << victim.output();
      victim.Signal(SIGKILL);
      ++kills_at[points[size_t(v)]];
    }
    for (auto& victim : victims) {
      auto status = victim->Wait(StressBound());
      ASSERT_TRUE(status.ok()) << status.status();
      ASSERT_EQ(DescribeWaitStatus(*status), "signal 9 (Killed)") << victim->output();
    }
    ASSERT_NO_FATAL_FAILURE(ExpectArenaEmpty("after the cycle's grace"));
    if (cycle == 0) rss_after_first = DaemonRssKiB();
  }

  // The daemon closes a dead worker's connections when it notices them go: wait for that.
  int fds_after = DaemonFds();
  for (const absl::Time deadline = absl::Now() + StressBound();
       fds_after != fds_before && absl::Now() < deadline; fds_after = DaemonFds()) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const int64_t rss_after = DaemonRssKiB();
  auto st = Observer()->Stats();
  ASSERT_TRUE(st.ok()) << st.status();
  std::string where;
  for (size_t i = 0; i < std::size(kKillPoints); ++i) {
    absl::StrAppend(&where, i ? ", " : "", kills_at[i], " ", kKillPoints[i].name);
  }
  const std::string summary =
      absl::StrCat(cycles, " cycles, ", cycles * kVictimsPerCycle, " workers killed (", where,
                   "); pages leaked ", st->pages.pages_used, "; daemon fds ", fds_before, " -> ",
                   fds_after, "; RSS ", rss_before, " KiB at start, ", rss_after_first,
                   " KiB after cycle 1, ", rss_after, " KiB after the storm");
  std::cout << "kill storm: " << summary << std::endl;
  RecordProperty("kill_storm", summary);
  EXPECT_EQ(st->pages.pages_used, 0);
  EXPECT_EQ(fds_after, fds_before);
  EXPECT_LE(rss_after, rss_after_first + kRssToleranceKiB);
}

}  // namespace
}  // namespace kvarena::testing
