#include "tests/mp/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace kvarena::testing {

Subprocess::~Subprocess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    (void)Wait(absl::Seconds(10));
  }
  if (reader_.joinable()) reader_.join();
}

absl::Status Subprocess::Start(const std::vector<std::string>& argv) {
  if (pid_ > 0 || reader_.joinable()) return absl::FailedPreconditionError("already started");
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  pid_ = pid;
  {
    absl::MutexLock lock(&mu_);
    output_.clear();
    eof_ = false;
  }
  reader_ = std::thread([this, fd = fds[0]] { ReadOutput(fd); });
  return absl::OkStatus();
}

void Subprocess::ReadOutput(int fd) {
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    absl::MutexLock lock(&mu_);
    output_.append(buf, size_t(n));
  }
  close(fd);
  absl::MutexLock lock(&mu_);
  eof_ = true;
}

void Subprocess::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no running child");
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      if (reader_.joinable()) reader_.join();  // the pipe closes with the child
      return status;
    }
    if (r < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("waitpid: ", strerror(errno)));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

bool Subprocess::WaitForOutput(std::string_view needle, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto seen = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return eof_ || output_.find(needle) != std::string::npos;
  };
  mu_.AwaitWithTimeout(absl::Condition(&seen), timeout);
  return output_.find(needle) != std::string::npos;
}

std::string Subprocess::output() const {
  absl::MutexLock lock(&mu_);
  return output_;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("wait status ", status);
}

}  // namespace kvarena::testing
