// WriteStream<Message>: the write queue a server stream of the daemon (Attach,
// WatchEvents) runs on. At most one write is in flight; what a subclass wants written
// meanwhile goes in the next write (WriteNextLocked, called as each write completes); an
// end requested during a write waits for it, and the first end wins. Finishing records the
// stream's end in RpcMetrics under its Rpc and lets the subclass add trailing metadata.
//
// State is guarded by mu_, which subclasses share for their own fields; gRPC is called
// under it (it runs no reaction inline). The subclass deletes itself in OnDone.
#ifndef KVARENA_DAEMON_WRITE_STREAM_H_
#define KVARENA_DAEMON_WRITE_STREAM_H_

#include <grpcpp/support/server_callback.h>

#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/rpc_metrics.h"
#include "daemon/status.h"

namespace kvarena {

template <typename Message>
class WriteStream : public grpc::ServerWriteReactor<Message> {
 public:
  // rpc: what RecordStreamEnd counts the end under; gone: the message of the CANCELLED end
  // when the client goes away ("attach: the client went away").
  WriteStream(RpcMetrics* rpcs, Rpc rpc, std::string gone)
      : rpcs_(rpcs), rpc_(rpc), gone_(std::move(gone)) {}

  // Finishes the stream with `status`, now or after the write in flight; the first end wins.
  void End(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_ || end_.has_value()) return;
    if (writing_) {
      end_ = std::move(status);
      return;
    }
    FinishLocked(status);
  }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    WriteDoneLocked(ok);
    if (end_.has_value()) return FinishLocked(*end_);
    if (!ok) return FinishLocked(absl::CancelledError(gone_));
    WriteNextLocked();
  }

  void OnCancel() override { End(absl::CancelledError(gone_)); }

 protected:
  // A write completed (ok: it reached the client), before the stream looks for an end.
  virtual void WriteDoneLocked(bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { (void)ok; }
  // Starts the next write (StartWriteLocked) if there is something to send.
  // REQUIRES: no write in flight, no end requested.
  virtual void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // Trailing metadata for the end with `status`, added just before Finish.
  virtual void AddTrailersLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    (void)status;
  }

  // Writes *message, which must stay untouched until the write completes.
  void StartWriteLocked(const Message* message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    this->StartWrite(message);
  }
  // Whether nothing more may be written: finished, or an end waits for the write in flight.
  bool EndingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return finished_ || end_.has_value();
  }
  bool WritingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return writing_; }
  // Asks for an end after the write in flight unless one was asked for already.
  void EndAfterWriteLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!end_.has_value()) end_ = std::move(status);
  }

  void FinishLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finished_ = true;
    rpcs_->RecordStreamEnd(rpc_, status);
    AddTrailersLocked(status);
    this->Finish(ToGrpcStatus(status));
  }

  absl::Mutex mu_;

 private:
  RpcMetrics* const rpcs_;
  const Rpc rpc_;
  const std::string gone_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> end_ ABSL_GUARDED_BY(mu_);  // to finish with after the write
  bool finished_ ABSL_GUARDED_BY(mu_) = false;            // Finish was called
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_WRITE_STREAM_H_
