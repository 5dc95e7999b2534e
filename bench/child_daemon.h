// ChildProcess: a program a benchmark starts as a child (kvarenad, redis-server), its output
// in a log file; killed with the bench (PDEATHSIG) and stopped (a signal, then reaped) by
// the destructor. ChildDaemon: the real kvarenad as such a child on a Unix socket in `dir`,
// its output in dir/kvarenad.log, stopped with SIGTERM. Header-only; thread-compatible.
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

// A child process running argv[0] with argv, its stdout and stderr in `log`; killed with
// the bench (PDEATHSIG: construct it on the main thread) and sent `stop_signal`, then
// reaped, by the destructor.
class ChildProcess {
 public:
  ChildProcess(std::vector<std::string> argv, const std::string& log, int stop_signal = SIGTERM)
      : stop_signal_(stop_signal) {
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ != 0) return;
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphan if the bench dies
    if (getppid() != parent) _exit(127);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0) _exit(127);
    execv(args[0], args.data());
    _exit(127);
  }
  ~ChildProcess() {
    if (pid_ <= 0) return;
    kill(pid_, stop_signal_);
    waitpid(pid_, nullptr, 0);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool ok() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

 private:
  int stop_signal_;
  pid_t pid_ = -1;
};

// kvarenad listening on dir/kvarena.sock, its log dir/kvarenad.log.
class ChildDaemon {
 public:
  ChildDaemon(const std::string& binary, const std::string& dir,
              std::vector<std::string> flags = {"--arena_bytes=1Gi"})
      : socket_(dir + "/kvarena.sock"),
        process_(Argv(binary, socket_, flags), dir + "/kvarenad.log") {}

  bool ok() const { return process_.ok(); }
  std::string address() const { return "unix:" + socket_; }
  pid_t pid() const { return process_.pid(); }

 private:
  static std::vector<std::string> Argv(const std::string& binary, const std::string& socket,
                                       const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {binary, "--listen=unix:" + socket};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return argv;
  }

  std::string socket_;
  ChildProcess process_;
};

}  // namespace kvarena

#endif  // KVARENA_BENCH_CHILD_DAEMON_H_
