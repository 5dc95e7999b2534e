// The multi-process test fixture: a temp dir, a real kvarenad on a Unix socket inside it,
// real kvarena_worker / kvarena processes, and a stats-only client (no session) to watch
// the arena. Binary paths come from compile definitions set by CMake.
#ifndef KVARENA_TESTS_MP_MP_FIXTURE_H_
#define KVARENA_TESTS_MP_MP_FIXTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvarena/client.h"
#include "tests/mp/subprocess.h"

namespace kvarena::testing {

struct CommandResult {
  int wait_status = -1;
  std::string output;
  bool exited_ok() const;
};

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
  // A worker with the default shape plus extra flags; its stdout is captured.
  std::unique_ptr<Subprocess> StartWorker(uint64_t seed, const std::vector<std::string>& flags);
  // Waits for exit and asserts exit 0, printing the output otherwise.
  void ExpectExitsOk(Subprocess& p, const std::string& name,
                     absl::Duration timeout = absl::Seconds(90));

  // A client with no session, for stats and health.
  std::shared_ptr<Client> Observer();
  // Polls Stats until pages_used satisfies pred, up to timeout; returns the last value.
  int64_t WaitForArenaPages(const std::function<bool(int64_t)>& pred, absl::Duration timeout);

 private:
  std::string dir_;
  std::string socket_path_;
  std::unique_ptr<Subprocess> daemon_;
  std::shared_ptr<Client> observer_;
};

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_MP_MP_FIXTURE_H_
