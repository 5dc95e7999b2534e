// The stress tests' fixture: tests/mp's MultiProcessTest (a real kvarenad on a Unix socket
// in a temp dir, an observer client) plus real kvarena_stress_worker processes, the
// daemon's open fds and RSS from /proc, and the workers' report lines summed.
//
// Sizes are bounded by counts, never by time: each test reads its count from an env var
// (scripts/soak.sh raises them) and waits for events with StressBound() as a failure guard.
#ifndef KVARENA_TESTS_STRESS_STRESS_FIXTURE_H_
#define KVARENA_TESTS_STRESS_STRESS_FIXTURE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/mp/mp_fixture.h"

namespace kvarena::testing {

// $name as a positive integer, else fallback.
int64_t EnvCount(const char* name, int64_t fallback);

// A worker's "report ..." line as key -> value ("ops", "append", "append:RESOURCE_EXHAUSTED").
using Report = std::map<std::string, int64_t>;
// Sums the values of every line of `output` that starts with `tag` + " ".
Report ParseReports(const std::string& output, const std::string& tag);
void AddReport(const Report& from, Report* to);
// "ops=N allocate=N ..." in the report's key order.
std::string FormatReport(const Report& r);

// One cache as a worker listed it while holding: "cache ID pool P pages 3,4,9".
struct HeldCache {
  std::string cache_id;
  uint64_t pool_id = 0;
  std::vector<int32_t> pages;
};
std::vector<HeldCache> ParseHeldCaches(const std::string& output);

class StressTest : public MultiProcessTest {
 protected:
  // The guard of every wait here: generous, since a stress run on a busy 2-core machine
  // may take minutes; it only turns a hang into a failure.
  static absl::Duration StressBound() { return absl::Minutes(10); }

  // A kvarena_stress_worker on this daemon with --seed = the test's seed + index.
  std::unique_ptr<Subprocess> StartStressWorker(uint64_t index,
                                                const std::vector<std::string>& flags);
  // Waits for the line, failing the test with the worker's output if it does not come.
  void ExpectLine(Subprocess& worker, const std::string& line, const std::string& name);

  // The daemon's open fds and resident set, from /proc/PID/fd and /proc/PID/statm.
  int DaemonFds();
  int64_t DaemonRssKiB();
  // Waits until every page, cache and session (and its scratch region) is gone.
  void ExpectArenaEmpty(const std::string& when);
};

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_STRESS_STRESS_FIXTURE_H_
