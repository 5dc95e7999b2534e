// kvarenad: parses flags, starts the daemon, drains on SIGTERM/SIGINT and exits 0.
#include <string.h>

#include <iostream>

#include "absl/flags/parse.h"
#include "daemon/flags.h"
#include "daemon/server.h"
#include "daemon/signals.h"

int main(int argc, char** argv) {
  kvarena::BlockTerminationSignals();  // before gRPC starts any thread
  kvarena::ConfigureFlagsUsage();
  absl::ParseCommandLine(argc, argv);

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
