// Handoff: a thread that runs one piece of work each time it is asked over a Unix socket
// pair and answers the same way. A call costs what any served call costs beyond its work,
// two thread wake-ups (the worker's, then the caller's), and nothing else: no gRPC, no
// framing, no copy. rpc_bench sets it beside the RPC rows as the floor of serving from
// another thread or process on the same machine. Header-only; one caller at a time.
#ifndef KVARENA_BENCH_HANDOFF_H_
#define KVARENA_BENCH_HANDOFF_H_

#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <thread>
#include <utility>

namespace kvarena {

class Handoff {
 public:
  explicit Handoff(std::function<bool()> work) : work_(std::move(work)) {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_) != 0) return;
    thread_ = std::thread([this] {
      char c;
      while (read(fds_[1], &c, 1) == 1) {
        c = work_() ? kOk : kFailed;
        if (write(fds_[1], &c, 1) != 1) return;
      }
    });
  }
  ~Handoff() {
    if (fds_[0] >= 0) shutdown(fds_[0], SHUT_RDWR);  // the thread's read sees end of file
    if (thread_.joinable()) thread_.join();
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }
  Handoff(const Handoff&) = delete;
  Handoff& operator=(const Handoff&) = delete;

  // Runs the work on the thread and waits for it; false if it failed or the thread is gone.
  bool Call() {
    char c = kRun;
    return thread_.joinable() && write(fds_[0], &c, 1) == 1 && read(fds_[0], &c, 1) == 1 &&
           c == kOk;
  }

 private:
  static constexpr char kRun = 'r', kOk = 'y', kFailed = 'n';
  std::function<bool()> work_;
  int fds_[2] = {-1, -1};  // [0]: the caller's end, [1]: the thread's
  std::thread thread_;
};

}  // namespace kvarena

#endif  // KVARENA_BENCH_HANDOFF_H_
