#include "tests/daemon/daemon_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "grpc/health/v1/health.grpc.pb.h"

extern char** environ;

namespace kvarena {
namespace {

// Starts argv with stdout and stderr appended to log_path; returns the pid or -1. The child
// gets SIGKILL if this thread dies, so a crashed test leaves no daemon behind.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // Child: async-signal-safe calls only until exec.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0) _exit(127);
  execve(args[0], args.data(), environ);
  _exit(127);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int RunCommand(const std::vector<std::string>& argv, std::string* output) {
  TempDir dir;
  const std::string log = dir.path() + "/out.log";
  const pid_t pid = Spawn(argv, log);
  int status = -1;
  if (pid > 0) waitpid(pid, &status, 0);
  *output = ReadFile(log);
  return status;
}

int PickUnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

DaemonProcess::DaemonProcess(std::vector<std::string> flags,
                             const std::function<void(const std::string&)>& before_start)
    : socket_path_(dir_.path() + "/kvarena.sock"), log_path_(dir_.path() + "/kvarenad.log") {
  // $KVARENAD_UNDER_TEST runs the tests against another build (an older one, to show a
  // regression test fails there).
  const char* binary = std::getenv("KVARENAD_UNDER_TEST");
  std::vector<std::string> argv = {binary != nullptr ? binary : KVARENAD_PATH,
                                   "--listen=unix:" + socket_path_, "--backend=host"};
  for (const std::string& flag : flags) {
    absl::string_view listen = flag;
    if (absl::ConsumePrefix(&listen, "--listen=unix:")) {
      socket_path_ = std::string(listen.substr(0, listen.find(',')));
    }
    argv.push_back(flag);
  }
  if (before_start) before_start(socket_path_);
  pid_ = Spawn(argv, log_path_);
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

std::shared_ptr<grpc::Channel> DaemonProcess::NewChannel() const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  // A distinct argument keeps channels from sharing one subchannel (and connection).
  static std::atomic<int> next{0};
  args.SetInt("kvarena.test.channel", next++);
  return grpc::CreateCustomChannel(address(), grpc::InsecureChannelCredentials(), args);
}

bool DaemonProcess::WaitServing(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (WaitExit(absl::ZeroDuration()).has_value()) return false;
    // A fresh channel each time: a channel whose first connect failed backs off for seconds.
    auto stub = grpc::health::v1::Health::NewStub(NewChannel());
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    if (stub->Check(&ctx, req, &resp).ok() &&
        resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  // kvarenad prints its start line just after it starts serving.
  while (absl::Now() < deadline) {
    if (Log().find("kvarenad: serving ") != std::string::npos) return true;
    if (WaitExit(absl::ZeroDuration()).has_value()) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

void DaemonProcess::Signal(int sig) const {
  if (pid_ > 0 && !exited_) kill(pid_, sig);
}

std::optional<int> DaemonProcess::WaitExit(absl::Duration timeout) {
  if (exited_) return exit_status_;
  const absl::Time deadline = absl::Now() + timeout;
  do {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      exit_status_ = status;
      return status;
    }
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(10));
  } while (true);
  return std::nullopt;
}

std::string DaemonProcess::Log() const { return ReadFile(log_path_); }

}  // namespace kvarena
