// FdMetrics: what the fd socket served, for the metrics endpoint — requests by operation
// and reply code, the fds its replies carried and the bytes of memory those fds map,
// the connections open now and those closed at once for being over
// --max_fd_connections. Relaxed atomics, read one by one.
//
// Thread-safety: every method may run concurrently.
#ifndef KVARENA_DAEMON_FD_METRICS_H_
#define KVARENA_DAEMON_FD_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "daemon/fd_requests.h"
#include "daemon/rpc_metrics.h"

namespace kvarena {

class FdMetrics {
 public:
  FdMetrics() = default;
  FdMetrics(const FdMetrics&) = delete;
  FdMetrics& operator=(const FdMetrics&) = delete;

  // A request was answered with `code` (the reply's, whether or not it could be sent).
  void CountRequest(FdOp op, absl::StatusCode code) {
    int c = static_cast<int>(code);
    if (c < 0 || c >= kNumStatusCodes) c = static_cast<int>(absl::StatusCode::kUnknown);
    requests_[static_cast<int>(op)][c].fetch_add(1, std::memory_order_relaxed);
  }
  // A reply carrying `fds` descriptors that map `bytes` in all was sent.
  void CountExport(uint64_t fds, uint64_t bytes) {
    fds_.fetch_add(fds, std::memory_order_relaxed);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void ConnectionOpened() { open_.fetch_add(1, std::memory_order_relaxed); }
  void ConnectionClosed() { open_.fetch_sub(1, std::memory_order_relaxed); }
  void ConnectionRefused() { refused_.fetch_add(1, std::memory_order_relaxed); }

  uint64_t requests(FdOp op, absl::StatusCode code) const {
    return requests_[static_cast<int>(op)][static_cast<int>(code)].load(std::memory_order_relaxed);
  }
  uint64_t fds_exported() const { return fds_.load(std::memory_order_relaxed); }
  uint64_t bytes_exported() const { return bytes_.load(std::memory_order_relaxed); }
  int64_t connections() const { return open_.load(std::memory_order_relaxed); }
  uint64_t connections_refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  std::array<std::array<std::atomic<uint64_t>, kNumStatusCodes>, kNumFdOps> requests_{};
  std::atomic<uint64_t> fds_{0};
  std::atomic<uint64_t> bytes_{0};
  std::atomic<int64_t> open_{0};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_FD_METRICS_H_
