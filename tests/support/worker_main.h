// The shared main of the test worker programs (kvarena_worker, kvarena_prefix_worker,
// kvarena_batch_worker, kvarena_stress_worker), real processes the multi-process and
// stress tests start, and the SIGUSR1 pause their tests resume them from.
#ifndef KVARENA_TESTS_SUPPORT_WORKER_MAIN_H_
#define KVARENA_TESTS_SUPPORT_WORKER_MAIN_H_

#include <string>

#include "absl/status/status.h"

namespace kvarena::testing {

// Parses the flags, blocks SIGUSR1 in every thread before any starts (so a signal sent
// early stays pending until WaitForSigusr1 takes it), runs `run` and prints "worker ok",
// returning 0, or "worker FAILED: <status>", returning 1. For main() to return.
int WorkerMain(int argc, char** argv, absl::Status (*run)());

// Prints "<line> (SIGUSR1 resumes)" and waits until SIGUSR1 arrives.
// REQUIRES: running under WorkerMain (SIGUSR1 blocked).
void WaitForSigusr1(const std::string& line);

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_SUPPORT_WORKER_MAIN_H_
