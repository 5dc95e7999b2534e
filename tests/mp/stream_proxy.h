// StreamProxy: a byte forwarder between a client and kvarenad, so a test can break the
// connections under a live client the way a network or a restarted sidecar proxy does:
// Cut() closes every connection open through it (both ends), and while refusing it closes
// each new connection at once. It listens on a Unix socket or on 127.0.0.1 and forwards
// to a Unix socket path or a 127.0.0.1 port.
//
// Thread-safety: the methods may be called from any thread; one thread forwards.
#ifndef KVARENA_TESTS_MP_STREAM_PROXY_H_
#define KVARENA_TESTS_MP_STREAM_PROXY_H_

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kvarena::testing {

class StreamProxy {
 public:
  // listen and target: "unix:PATH" or "127.0.0.1:PORT" (PORT 0 for listen: any free port).
  static absl::StatusOr<std::unique_ptr<StreamProxy>> Start(const std::string& listen,
                                                            const std::string& target);
  ~StreamProxy();
  StreamProxy(const StreamProxy&) = delete;
  StreamProxy& operator=(const StreamProxy&) = delete;

  // What a client connects to: "unix:PATH" or "127.0.0.1:PORT".
  const std::string& address() const { return address_; }
  // Closes every connection open now, both ends; returns once they are closed.
  void Cut() ABSL_LOCKS_EXCLUDED(mu_);
  // While true, each new connection is closed as soon as it is accepted.
  void SetRefusing(bool refusing) ABSL_LOCKS_EXCLUDED(mu_);
  // Connections accepted and forwarded, and accepted and closed (refusing), so far.
  int forwarded() const ABSL_LOCKS_EXCLUDED(mu_);
  int refused() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  StreamProxy(int listen_fd, std::string address, std::string target, int wake_read,
              int wake_write);
  void Run();  // the forwarding thread
  void Wake() const;

  const int listen_fd_;
  const std::string address_;
  const std::string target_;
  const int wake_read_, wake_write_;  // a pipe that interrupts the thread's poll

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool refusing_ ABSL_GUARDED_BY(mu_) = false;
  int cuts_requested_ ABSL_GUARDED_BY(mu_) = 0;
  int cuts_done_ ABSL_GUARDED_BY(mu_) = 0;
  int forwarded_ ABSL_GUARDED_BY(mu_) = 0;
  int refused_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_MP_STREAM_PROXY_H_
