// AttachStream: one Attach call a remote client holds open (DESIGN.md "Attach"); a
// client holds one at a time, and opens another with the resume token when one breaks
// (RemoteTransport). A reader thread reads its events: the first names the session, its
// resume token and grace, and the fd socket; later ones announce new pools (RegionClient
// maps a pool on its first use, so they need no action). When the stream ends — the
// daemon went away, or this object is destroyed — the reader drops the call and its
// channel reference (a draining daemon waits for its connections to close, not only for
// calls) and runs on_end once.
//
// Thread-safety: Open once, before sharing; the accessors are safe for concurrent use.
// on_end runs on the reader thread with no lock of this object held.
#ifndef KVARENA_CLIENT_ATTACH_STREAM_H_
#define KVARENA_CLIENT_ATTACH_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvarena/v1/kvarena.grpc.pb.h"

namespace kvarena::client_internal {

class AttachStream {
 public:
  // on_end runs once the stream ended; end_status() says why.
  AttachStream(std::shared_ptr<grpc::Channel> channel, std::function<void()> on_end);
  // Cancels the call and waits for the reader thread (which runs on_end first).
  ~AttachStream();
  AttachStream(const AttachStream&) = delete;
  AttachStream& operator=(const AttachStream&) = delete;

  // Opens the stream as client_name — resuming the session of resume_token unless it is
  // empty, waiting for the channel to connect when wait_for_ready — and waits up to
  // `timeout` for its first event. UNAVAILABLE naming address when none came, or the
  // stream's end status.
  absl::Status Open(const std::string& client_name, const std::string& resume_token,
                    bool wait_for_ready, absl::Duration timeout, const std::string& address);
  // From the first event ("" and 0 before it).
  std::string session_id() const;
  std::string resume_token() const;
  absl::Duration session_grace() const;
  std::string fd_socket() const;
  // Once ended: why (UNAVAILABLE with kUnavailablePrefix, or the stream's own status),
  // and whether the daemon ended it because it is shutting down (kAttachEndShutdown).
  bool ended() const;
  absl::Status end_status() const;
  bool ended_by_shutdown() const;

 private:
  // The reader thread: starts the call and reads it to its end.
  void ReadEvents(const v1::AttachRequest& req);

  std::function<void()> on_end_;
  std::thread reader_thread_;
  mutable absl::Mutex mu_;
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<v1::KvCacheService::Stub> stub_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<grpc::ClientContext> ctx_ ABSL_GUARDED_BY(mu_);
  v1::AttachEvent first_ ABSL_GUARDED_BY(mu_);  // session_id "" until it came
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  bool ended_by_shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_ATTACH_STREAM_H_
