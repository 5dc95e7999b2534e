// The daemon SIGKILLed under load and restarted on the same socket path: every thread of
// every worker sees UNAVAILABLE, its handles report is_valid() false and its client says
// it is disconnected (the workers check); the workers then connect again and are served by
// the new daemon, as is a new observer.
//
// $KVARENA_STRESS_OPS sets the operations per thread after the restart (default 100).
#include <signal.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/stress/stress_fixture.h"

namespace kvarena::testing {
namespace {

constexpr int kWorkers = 4, kThreads = 4;

class DaemonKillTest : public StressTest {};

TEST_F(DaemonKillTest, WorkersSeeUnavailableAndAreServedByTheRestartedDaemon) {
  const int64_t ops = EnvCount("KVARENA_STRESS_OPS", 100);
  const std::vector<std::string> daemon_flags = {"--session_grace=200ms", "--scratch_bytes=2Mi"};
  StartDaemonWith(daemon_flags);
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int i = 0; i < kWorkers; ++i) {
    std::vector<std::string> flags = {"--mode=survive", absl::StrCat("--threads=", kThreads),
                                      absl::StrCat("--ops=", ops)};
    if (i % 2 == 1) flags.push_back("--inline_tensors");
    workers.push_back(StartStressWorker(uint64_t(i), flags));
  }
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_NO_FATAL_FAILURE(
        ExpectLine(*workers[size_t(i)], "phase running", absl::StrCat("worker ", i)));
  }
  auto loaded = Observer()->Stats();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->num_sessions, kWorkers);

  for (auto& w : workers)
    ASSERT_EQ(w->output().find("daemon gone"), std::string::npos) << w->output();
  daemon().Signal(SIGKILL);
  auto killed = daemon().Wait(StressBound());
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_EQ(DescribeWaitStatus(*killed), "signal 9 (Killed)");
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_NO_FATAL_FAILURE(
        ExpectLine(*workers[size_t(i)], "daemon gone", absl::StrCat("worker ", i)));
  }

  // The same socket path, a stale socket file left behind; the workers, already trying to
  // connect, and a new observer are served by the new daemon.
  StartDaemonWith(daemon_flags);
  EXPECT_TRUE(Observer()->Stats().ok());
  Report before, after;
  for (int i = 0; i < kWorkers; ++i) {
    Subprocess& w = *workers[size_t(i)];
    ExpectExitsOk(w, absl::StrCat("worker ", i), StressBound());
    EXPECT_NE(w.output().find("reconnected"), std::string::npos) << w.output();
    AddReport(ParseReports(w.output(), "report_before_restart"), &before);
    AddReport(ParseReports(w.output(), "report"), &after);
  }
  EXPECT_EQ(after["ops"], kWorkers * kThreads * ops) << FormatReport(after);
  const std::string summary = absl::StrCat(kWorkers, " processes x ", kThreads,
                                           " threads; before the kill: ", FormatReport(before),
                                           "; after the restart: ", FormatReport(after));
  std::cout << "daemon kill: " << summary << std::endl;
  RecordProperty("daemon_kill", summary);
  ExpectArenaEmpty("after every worker exited");
}

}  // namespace
}  // namespace kvarena::testing
