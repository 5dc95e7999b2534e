// The multi-process test fixture: a temp dir, a real kvarenad on a Unix socket inside it,
// real kvarena_worker / kvarena processes, and a stats-only client (no session) to watch
// the arena. Binary paths come from compile definitions set by CMake.
#ifndef KVARENA_TESTS_MP_MP_FIXTURE_H_
#define KVARENA_TESTS_MP_MP_FIXTURE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvarena/client.h"
#include "tests/mp/subprocess.h"
#include "tests/support/test_seed.h"

namespace kvarena::testing {

struct CommandResult {
  int wait_status = -1;
  std::string output;
  bool exited_ok() const;
};

// How long a test waits for an event (a worker's line, pages coming back, an exit) before
// it fails. Only a failure guard: every wait ends as soon as the event happens, and no test
// asserts how long anything took.
inline constexpr absl::Duration kEventBound = absl::Seconds(60);

// Runs a command to completion (timeout: DEADLINE_EXCEEDED, the child is killed).
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration timeout = absl::Seconds(30));

class MultiProcessTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  std::string address() const { return "unix:" + socket_path_; }
  const std::string& dir() const { return dir_; }

  // Starts kvarenad on the socket with --session_grace and --backend and waits until it
  // is SERVING.
  void StartDaemon(const std::string& session_grace = "1s", const std::string& backend = "host");
  Subprocess& daemon() { return *daemon_; }
  // Starts kvarenad with the fixture's flags followed by `flags` (a later flag overrides an
  // earlier one) and waits until it is SERVING.
  void StartDaemonWith(const std::vector<std::string>& flags);
  // Starts `path --address=<this daemon> flags...` with its stdout captured.
  std::unique_ptr<Subprocess> StartProgram(const std::string& path,
                                           const std::vector<std::string>& flags);
  // A worker with the default shape plus extra flags; its stdout is captured. Its --seed
  // is the test's seed plus `index`.
  std::unique_ptr<Subprocess> StartWorker(uint64_t index, const std::vector<std::string>& flags);
  // Waits for exit and asserts exit 0, printing the output otherwise.
  void ExpectExitsOk(Subprocess& p, const std::string& name,
                     absl::Duration timeout = absl::Seconds(90));

  // 2 layers, 2 kv heads, head_dim 16, float32: a cache for tests about lifetimes, not
  // numerics.
  static CacheSpec SmallSpec();
  // A client with no session, for stats and health.
  std::shared_ptr<Client> Observer();
  // Polls Stats until pages_used satisfies pred, up to timeout; returns the last value.
  int64_t WaitForArenaPages(const std::function<bool(int64_t)>& pred,
                            absl::Duration timeout = kEventBound);
  // Polls Stats until done(stats) holds, up to timeout; false on timeout.
  bool WaitForArena(const std::function<bool(const ArenaStats&)>& done,
                    absl::Duration timeout = kEventBound);

  // The seed of this test's random choices (the workers' q/k/v among them): printed, and
  // taken from $KVARENA_SEED when set.
  const uint32_t seed_ = TestSeed();

 private:
  std::string dir_;
  std::string socket_path_;
  std::unique_ptr<Subprocess> daemon_;
  std::shared_ptr<Client> observer_;
};

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_MP_MP_FIXTURE_H_
