// ChildDaemon: the real kvarenad started by a benchmark as a child process on a Unix
// socket in `dir`, its output in dir/kvarenad.log; killed with the bench (PDEATHSIG) and
// stopped (SIGTERM, then reaped) by the destructor. Header-only; thread-compatible.
#ifndef KVARENA_BENCH_CHILD_DAEMON_H_
#define KVARENA_BENCH_CHILD_DAEMON_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

namespace kvarena {

// The kvarenad built beside this benchmark (build/bench/.. -> build/daemon/kvarenad).
inline std::string DefaultKvarenadPath() {
  return (std::filesystem::canonical("/proc/self/exe").parent_path() / "../daemon/kvarenad")
      .string();
}

class ChildDaemon {
 public:
  ChildDaemon(const std::string& binary, const std::string& dir,
              std::vector<std::string> flags = {"--arena_bytes=1Gi"})
      : socket_(dir + "/kvarena.sock") {
    const std::string log = dir + "/kvarenad.log";
    std::vector<std::string> argv = {binary, "--listen=unix:" + socket_};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ != 0) return;
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphaned daemon if the bench dies
    if (getppid() != parent) _exit(127);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0) _exit(127);
    execv(args[0], args.data());
    _exit(127);
  }
  ~ChildDaemon() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  ChildDaemon(const ChildDaemon&) = delete;
  ChildDaemon& operator=(const ChildDaemon&) = delete;

  bool ok() const { return pid_ > 0; }
  std::string address() const { return "unix:" + socket_; }
  pid_t pid() const { return pid_; }

 private:
  std::string socket_;
  pid_t pid_ = -1;
};

}  // namespace kvarena

#endif  // KVARENA_BENCH_CHILD_DAEMON_H_
