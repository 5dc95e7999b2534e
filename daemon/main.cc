// kvarenad: parses flags, raises the open-file limit, starts the daemon, drains on
// SIGTERM/SIGINT and exits 0.
#include <string.h>
#include <sys/resource.h>

#include <cerrno>
#include <iostream>
#include <string>

#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "daemon/flags.h"
#include "daemon/server.h"
#include "daemon/signals.h"

namespace {

std::string Limit(rlim_t n) { return n == RLIM_INFINITY ? "unlimited" : absl::StrCat(n); }

// Raises RLIMIT_NOFILE's soft limit to its hard limit (a CUDA pool is one fd per 2 MiB
// allocation, and every fd-socket connection and reply holds some); returns the log line.
std::string RaiseOpenFileLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) {
    return absl::StrCat("kvarenad: getrlimit(RLIMIT_NOFILE): ", strerror(errno));
  }
  const rlim_t soft = r.rlim_cur;
  r.rlim_cur = r.rlim_max;
  if (soft != r.rlim_max && setrlimit(RLIMIT_NOFILE, &r) != 0) {
    return absl::StrCat("kvarenad: open files (RLIMIT_NOFILE): soft limit stays ", Limit(soft),
                        ", raising it to the hard limit ", Limit(r.rlim_max),
                        " failed: ", strerror(errno));
  }
  return absl::StrCat("kvarenad: open files (RLIMIT_NOFILE): soft limit ", Limit(soft), " -> ",
                      Limit(r.rlim_max), " (the hard limit)");
}

// The fds kvarenad itself may hold at its bounds: a memfd per host pool, a scratch memfd
// per session, the fd-socket connections, and a few of its own. What is left of the soft
// limit is for gRPC's connections — and gRPC 1.51 stops accepting for good once accept
// runs out of fds (grpc/grpc#20418), so say so when the room is small.
void WarnIfFewFdsLeft(const kvarena::DaemonOptions& o) {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return;
  const uint64_t own = uint64_t(o.store.max_pools) + uint64_t(o.store.max_sessions) +
                       uint64_t(o.max_fd_connections) + 64;
  constexpr uint64_t kWantedConnections = 1024;
  if (r.rlim_cur >= own + kWantedConnections) return;
  std::cerr << "kvarenad: warning: RLIMIT_NOFILE=" << r.rlim_cur << " leaves room for "
            << (r.rlim_cur > own ? r.rlim_cur - own : 0)
            << " gRPC connections after kvarenad's own "
            << "bounds (--max_pools + --max_sessions + --max_fd_connections + 64 = " << own
            << "); gRPC stops accepting for good when it runs out of fds: raise the hard limit "
            << "(ulimit -Hn, LimitNOFILE=) or lower those flags" << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  kvarena::BlockTerminationSignals();  // before gRPC starts any thread
  kvarena::ConfigureFlagsUsage();
  absl::ParseCommandLine(argc, argv);
  kvarena::ApplyProcessFlags();
  std::cerr << RaiseOpenFileLimit() << std::endl;

  const kvarena::DaemonOptions options = kvarena::OptionsFromFlags();
  WarnIfFewFdsLeft(options);
  absl::StatusOr<std::unique_ptr<kvarena::Daemon>> daemon = kvarena::Daemon::Start(options);
  if (!daemon.ok()) {
    std::cerr << "kvarenad: " << daemon.status().message() << std::endl;
    return 1;
  }
  std::cout << (*daemon)->StartLine() << std::endl;

  const int sig = kvarena::WaitForTerminationSignal();
  std::cerr << "kvarenad: " << strsignal(sig) << ": draining (health NOT_SERVING)" << std::endl;
  (*daemon)->Shutdown(absl::Seconds(5));
  (*daemon)->Wait();
  return 0;
}
