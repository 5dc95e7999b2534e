#include "client/fork_guard.h"

#include <pthread.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace kvarena::client_internal {
namespace {

void CountForkInChild() { ForkGuard::Forks().fetch_add(1, std::memory_order_relaxed); }

// Registers the handler the first time a guard is made; a child inherits the registration.
void RegisterOnce() {
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, CountForkInChild);
    return true;
  }();
  (void)registered;
}

}  // namespace

std::atomic<uint64_t>& ForkGuard::Forks() {
  static std::atomic<uint64_t> forks{0};
  return forks;
}

ForkGuard::ForkGuard() : pid_(int(getpid())), forks_((RegisterOnce(), Forks().load())) {}

absl::Status ForkGuard::ForkedStatus() const {
  return absl::FailedPreconditionError(absl::StrCat(
      "client created in pid ", pid_, " used in pid ", int(getpid()),
      " after fork(); connect anew in the child (a client's connection, threads and mapped "
      "memory belong to the process that connected)"));
}

}  // namespace kvarena::client_internal
