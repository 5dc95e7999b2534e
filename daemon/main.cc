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
                        ", raising it to the hard limit ", Limit(r.rlim_max), " failed: ", strerror(errno));
  }
  return absl::StrCat("kvarenad: open files (RLIMIT_NOFILE): soft limit ", Limit(soft), " -> ",
                      Limit(r.rlim_max), " (the hard limit)");
}

}  // namespace

int main(int argc, char** argv) {
  kvarena::BlockTerminationSignals();  // before gRPC starts any thread
  kvarena::ConfigureFlagsUsage();
  absl::ParseCommandLine(argc, argv);
  std::cerr << RaiseOpenFileLimit() << std::endl;

  absl::StatusOr<std::unique_ptr<kvarena::Daemon>> daemon =
      kvarena::Daemon::Start(kvarena::OptionsFromFlags());
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
