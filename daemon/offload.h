// Offload: the threads that run the KvCacheService calls too long to run on gRPC's
// callback threads (the few that read every connection and also serve Health/Check and
// the streams): a prefill Append, an Attend over a long context, GetKv, ListCaches.
// A task runs on an idle thread, or on a new one while fewer than max_threads exist, else
// waits its turn in arrival order. Threads, once started, stay until the destructor.
//
// Thread-safety: Run may be called from any thread. The destructor runs every task
// queued before it to the end and joins the threads; nothing may call Run meanwhile.
#ifndef KVARENA_DAEMON_OFFLOAD_H_
#define KVARENA_DAEMON_OFFLOAD_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvarena {

class Offload {
 public:
  explicit Offload(int max_threads) : max_threads_(max_threads) {}  // REQUIRES: max_threads >= 1
  ~Offload();
  Offload(const Offload&) = delete;
  Offload& operator=(const Offload&) = delete;

  void Run(std::function<void()> task);

  // Threads started so far (tests).
  int TEST_threads() const;

 private:
  void Work();
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_threads_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;  // threads waiting for a task
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_OFFLOAD_H_
