#include "tests/support/worker_main.h"

#include <pthread.h>
#include <signal.h>

#include <cstdio>

#include "absl/flags/parse.h"

namespace kvarena::testing {
namespace {

sigset_t Sigusr1() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  return set;
}

}  // namespace

int WorkerMain(int argc, char** argv, absl::Status (*run)()) {
  absl::ParseCommandLine(argc, argv);
  const sigset_t set = Sigusr1();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  const absl::Status s = run();
  if (!s.ok()) {
    std::printf("worker FAILED: %s\n", s.ToString().c_str());
    std::fflush(stdout);
    return 1;
  }
  std::printf("worker ok\n");
  return 0;
}

void WaitForSigusr1(const std::string& line) {
  std::printf("%s (SIGUSR1 resumes)\n", line.c_str());
  std::fflush(stdout);
  const sigset_t set = Sigusr1();
  int sig = 0;
  sigwait(&set, &sig);
}

}  // namespace kvarena::testing
