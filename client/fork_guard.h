// ForkGuard: tells the process that made a client apart from a fork() child of it.
//
// A client's connection belongs to the process that connected: its gRPC channel and the
// poller gRPC shares with every channel of the process, the Attach stream's reader thread,
// the fd socket, the scratch lanes and the mapped pools, the local kernels' threads. A
// child has the same sockets and mappings (shared with the parent, not copied) and none of
// the threads, so a call made through them in the child writes into the parent's HTTP/2
// connection and scratch lanes, reads its replies off the shared sockets, and waits on
// threads that do not exist; tearing them down shuts the parent's connection down. The
// client checks forked() at its call boundary and refuses (ForkedStatus), and leaks what
// a child drops (DeleteTransport, client/transport.h): the parent keeps all of it.
//
// A fork is seen through a pthread_atfork child handler that counts forks, so forked()
// is two loads, cheap enough for every local-path call.
//
// Thread-safety: immutable after construction; safe for concurrent use.
#ifndef KVARENA_CLIENT_FORK_GUARD_H_
#define KVARENA_CLIENT_FORK_GUARD_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"

namespace kvarena::client_internal {

class ForkGuard {
 public:
  // Records this process (and registers the fork counter's handler, once per process).
  ForkGuard();

  // True in a fork() child (or grandchild) of the process that made this guard.
  bool forked() const { return Forks().load(std::memory_order_relaxed) != forks_; }
  // FAILED_PRECONDITION: "client created in pid X used in pid Y after fork(); connect anew
  // in the child".
  absl::Status ForkedStatus() const;

  // Forks seen in this process's ancestry since the library loaded (the handler's count).
  static std::atomic<uint64_t>& Forks();

 private:
  const int pid_;
  const uint64_t forks_;
};

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_FORK_GUARD_H_
