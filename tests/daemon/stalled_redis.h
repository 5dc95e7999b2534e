// Test-only: StalledRedis, a TCP peer on 127.0.0.1 that stands in for a Redis behind a
// hung network path — the tier read that never ends (a FIFO under a chunk's name no
// longer does: the disk tier opens chunk files O_NONBLOCK and refuses what is not a
// regular file). It answers CLUSTER SLOTS as a plain, non-cluster Redis does, so the
// daemon's Redis tier starts; every other command gets a status reply that never ends,
// one byte every 100 ms, so each of the reader's socket reads gets data well within its
// timeout and the read goes on until Stop closes the connection (the reader then sees
// it fail: a tier error, a miss).
//
// Thread-safety: Stop and WaitStalled may be called from any thread; the rest is the
// owner's.
#ifndef KVARENA_TESTS_DAEMON_STALLED_REDIS_H_
#define KVARENA_TESTS_DAEMON_STALLED_REDIS_H_

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace kvarena {

class StalledRedis {
 public:
  StalledRedis();  // listens at once; port() 0 when it could not
  ~StalledRedis();
  StalledRedis(const StalledRedis&) = delete;
  StalledRedis& operator=(const StalledRedis&) = delete;

  int port() const { return port_; }
  // True once a command other than CLUSTER SLOTS arrived (a read is stalled), false if
  // none did within timeout.
  bool WaitStalled(absl::Duration timeout);
  // Closes every connection and stops listening; the stalled reads fail.
  void Stop();

 private:
  void Accept();
  void Serve(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> notified_{false};
  absl::Notification stalled_;
  absl::Mutex mu_;
  std::vector<std::thread> connections_ ABSL_GUARDED_BY(mu_);
  std::thread acceptor_;
};

}  // namespace kvarena

#endif  // KVARENA_TESTS_DAEMON_STALLED_REDIS_H_
