// Subprocess: a child process started by fork/exec for the multi-process tests, with its
// stdout and stderr captured (merged) by a reader thread so a test can wait for a line.
// The child gets SIGKILL if the test process dies; the destructor kills and reaps a child
// still running.
//
// Thread-safety: output()/WaitForOutput() may be called from any thread; Start, Signal
// and Wait from the owning thread.
#ifndef KVARENA_TESTS_MP_SUBPROCESS_H_
#define KVARENA_TESTS_MP_SUBPROCESS_H_

#include <sys/types.h>

#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvarena::testing {

class Subprocess {
 public:
  Subprocess() = default;
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // argv[0] is the binary's path.
  absl::Status Start(const std::vector<std::string>& argv);
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  void Signal(int sig);
  // Waits for the child to exit and returns its waitpid status (WIFEXITED...);
  // DEADLINE_EXCEEDED if it is still running after timeout.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // Waits until the output contains needle; false on timeout or when the output ended
  // without it.
  bool WaitForOutput(std::string_view needle, absl::Duration timeout);
  std::string output() const;

 private:
  void ReadOutput(int fd);

  pid_t pid_ = -1;
  std::thread reader_;
  mutable absl::Mutex mu_;
  std::string output_ ABSL_GUARDED_BY(mu_);
  bool eof_ ABSL_GUARDED_BY(mu_) = false;
};

// "exit 0", "exit 3", "signal 9 (Killed)".
std::string DescribeWaitStatus(int status);

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_MP_SUBPROCESS_H_
