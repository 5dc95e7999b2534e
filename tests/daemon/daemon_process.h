// DaemonProcess: the real kvarenad binary (KVARENAD_PATH; $KVARENAD_UNDER_TEST overrides
// it) run as a child process on a Unix socket in a fresh temporary directory, its stdout
// and stderr captured to a log file there. The destructor kills a daemon still running and removes
// the directory.
//
// Thread-compatible: one test thread drives it.
#ifndef KVARENA_TESTS_DAEMON_DAEMON_PROCESS_H_
#define KVARENA_TESTS_DAEMON_DAEMON_PROCESS_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/support/temp_dir.h"

namespace kvarena {

// Runs `argv` to completion with stdout and stderr captured; returns the wait status.
int RunCommand(const std::vector<std::string>& argv, std::string* output);

// A TCP port nothing listens on right now (bound then released).
int PickUnusedPort();

class DaemonProcess {
 public:
  // Starts kvarenad --listen=unix:<dir>/kvarena.sock --backend=host followed by `flags`.
  // A later flag overrides an earlier one: a --listen among `flags` replaces the default,
  // and its first unix: entry becomes socket_path(); a --backend picks another backend
  // (host is the default so that tests behave alike with and without a GPU).
  // `before_start` runs first, given socket_path().
  explicit DaemonProcess(std::vector<std::string> flags,
                         const std::function<void(const std::string&)>& before_start = {});
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  const std::string& dir() const { return dir_.path(); }
  const std::string& socket_path() const { return socket_path_; }
  std::string address() const { return "unix:" + socket_path_; }
  pid_t pid() const { return pid_; }

  std::shared_ptr<grpc::Channel> NewChannel() const;
  // Polls grpc.health.v1.Health/Check("") until SERVING, then waits for the start line in
  // the log; false on timeout or exit.
  bool WaitServing(absl::Duration timeout = absl::Seconds(10));
  void Signal(int sig) const;
  // The wait status once the daemon exits, nullopt if it is still running at the deadline.
  std::optional<int> WaitExit(absl::Duration timeout);
  std::string Log() const;

 private:
  TempDir dir_;
  std::string socket_path_;
  std::string log_path_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int exit_status_ = 0;
};

}  // namespace kvarena

#endif  // KVARENA_TESTS_DAEMON_DAEMON_PROCESS_H_
