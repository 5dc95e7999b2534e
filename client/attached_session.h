// AttachedSession: the session a remote client holds (DESIGN.md "Attach"), kept by one
// Attach stream at a time. Open() opens the first stream; when a stream breaks, a
// supervisor thread opens another with the session's resume token (options.resume): over
// TCP retried with backoff until the grace the daemon announced runs out, over a Unix
// socket once — there is no network in between, so a daemon that cannot be reached is
// gone, sessions and all. It does not try when the daemon ended the stream because it is
// shutting down, or when another stream took the session over (ABORTED). When the session
// is lost, on_lost runs once, on the supervisor thread, and the channel is let go.
//
// Thread-safety: Open once, before sharing; the accessors are safe for concurrent use.
#ifndef KVARENA_CLIENT_ATTACHED_SESSION_H_
#define KVARENA_CLIENT_ATTACHED_SESSION_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "client/attach_stream.h"
#include "kvarena/client.h"

namespace kvarena::client_internal {

class AttachedSession {
 public:
  AttachedSession(std::shared_ptr<grpc::Channel> channel, std::string address,
                  const ClientOptions& options, std::function<void(const absl::Status&)> on_lost);
  // Stops the supervisor (on_lost does not run) and ends the stream.
  ~AttachedSession();
  AttachedSession(const AttachedSession&) = delete;
  AttachedSession& operator=(const AttachedSession&) = delete;

  // Opens the first stream, waits up to options.connect_timeout for its first event and
  // starts the supervisor. UNAVAILABLE naming the address when no event came.
  absl::Status Open();
  // From the first event; a resumed session keeps them.
  const std::string& session_id() const { return session_id_; }
  const std::string& fd_socket() const { return fd_socket_; }
  // Times the session was resumed on a new stream.
  int64_t resumes() const { return resumes_.load(); }

 private:
  // Opens a stream — a new session, or resume_token's — and on success makes it stream_
  // (the ended one it replaces is destroyed).
  absl::Status OpenStream(const std::string& resume_token, absl::Duration timeout);
  bool over_unix() const;
  void OnStreamEnd() ABSL_LOCKS_EXCLUDED(mu_);  // a stream's reader thread
  void Supervise() ABSL_LOCKS_EXCLUDED(mu_);    // the supervisor thread
  // Opens streams with the resume token until one holds or it is time to give up: OK, or
  // why not (NOT_FOUND: the daemon no longer holds the session).
  absl::Status Resume() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string address_;
  const ClientOptions options_;
  const std::function<void(const absl::Status&)> on_lost_;
  std::shared_ptr<grpc::Channel> channel_;  // used by Open, then the supervisor only

  // Set once by Open, before the session is shared.
  std::string session_id_, fd_socket_;
  // Set by Open, then replaced by the supervisor alone at each resume (tokens rotate).
  std::string resume_token_;
  std::atomic<int64_t> resumes_{0};

  // The stream holding the session: set by Open, then replaced and used only by the
  // supervisor until the destructor has joined it.
  std::unique_ptr<AttachStream> stream_;
  std::thread supervisor_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;     // being destroyed
  uint64_t stream_ends_ ABSL_GUARDED_BY(mu_) = 0;  // streams that ended, to wake the supervisor
};

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_ATTACHED_SESSION_H_
