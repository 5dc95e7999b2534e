// Offload: the threads that run the KvCacheService calls too long to run on gRPC's
// callback threads (the few that read every connection and also serve Health/Check and
// the streams): a prefill Append, an Attend over a long context, GetKv, ListCaches, an
// Allocate that may read the tiers. A task runs on an idle thread, or on a new one while
// fewer than max_threads exist, else waits its turn in arrival order. Threads, once
// started, stay until the destructor.
//
// Each task comes with the bytes its call holds (its request) and holds them against
// max_bytes from Run until it has run: a task that would take the pool past max_bytes is
// refused (RESOURCE_EXHAUSTED, Refusal::kMaxQueuedBytes), unless the pool holds nothing,
// so no one call is ever refused for its size alone. So calls piling up behind blocked
// threads cannot take the daemon's memory without bound.
//
// Thread-safety: Run may be called from any thread. The destructor runs every task
// queued before it to the end and joins the threads; nothing may call Run meanwhile.
#ifndef KVARENA_DAEMON_OFFLOAD_H_
#define KVARENA_DAEMON_OFFLOAD_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace kvarena {

class Offload {
 public:
  // REQUIRES: max_threads >= 1. max_bytes: --max_queued_bytes.
  Offload(int max_threads, uint64_t max_bytes) : max_threads_(max_threads), max_bytes_(max_bytes) {}
  ~Offload();
  Offload(const Offload&) = delete;
  Offload& operator=(const Offload&) = delete;

  // Queues task, holding `bytes` until it has run; refused (task dropped, not run) when
  // the pool holds something and bytes would take it past max_bytes.
  absl::Status Run(uint64_t bytes, std::function<void()> task);

  // Threads started so far, and the bytes the pool's tasks hold (tests).
  int TEST_threads() const;
  uint64_t TEST_held_bytes() const;

 private:
  void Work();
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_threads_;
  const uint64_t max_bytes_;
  mutable absl::Mutex mu_;
  std::deque<std::pair<uint64_t, std::function<void()>>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // of the tasks queued or running
  int held_tasks_ ABSL_GUARDED_BY(mu_) = 0;
  int idle_ ABSL_GUARDED_BY(mu_) = 0;  // threads waiting for a task
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_OFFLOAD_H_
