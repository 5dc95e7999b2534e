#include "client/attached_session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"

namespace kvarena::client_internal {

AttachedSession::AttachedSession(std::shared_ptr<grpc::Channel> channel, std::string address,
                                 const ClientOptions& options,
                                 std::function<void(const absl::Status&)> on_lost)
    : address_(std::move(address)),
      options_(options),
      on_lost_(std::move(on_lost)),
      channel_(std::move(channel)) {}

AttachedSession::~AttachedSession() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (supervisor_.joinable()) supervisor_.join();
  stream_.reset();  // cancels the call; its end runs OnStreamEnd, which uses mu_
}

absl::Status AttachedSession::Open() {
  KVARENA_RETURN_IF_ERROR(OpenStream("", options_.connect_timeout));
  session_id_ = stream_->session_id();
  resume_token_ = stream_->resume_token();
  fd_socket_ = stream_->fd_socket();
  supervisor_ = std::thread([this] { Supervise(); });
  return absl::OkStatus();
}

bool AttachedSession::over_unix() const { return absl::StartsWith(address_, "unix:"); }

absl::Status AttachedSession::OpenStream(const std::string& resume_token, absl::Duration timeout) {
  auto stream = std::make_unique<AttachStream>(channel_, [this] { OnStreamEnd(); });
  // Over TCP a resume waits for the channel to reconnect; a Unix socket fails at once.
  const bool wait_for_ready = !resume_token.empty() && !over_unix();
  if (auto s = stream->Open(options_.client_name, resume_token, wait_for_ready, timeout, address_);
      !s.ok()) {
    return s;
  }
  stream_ = std::move(stream);
  return absl::OkStatus();
}

void AttachedSession::OnStreamEnd() {
  absl::MutexLock lock(&mu_);
  ++stream_ends_;
}

void AttachedSession::Supervise() {
  uint64_t seen = 0;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto woken = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || stream_ends_ != seen;
      };
      mu_.Await(absl::Condition(&woken));
      if (stopping_) return;
      seen = stream_ends_;
    }
    if (!stream_->ended()) continue;  // a stream that failed to open ended
    absl::Status why = stream_->end_status();
    if (options_.resume && !stream_->ended_by_shutdown() && !absl::IsAborted(why)) {
      const absl::Status resumed = Resume();
      if (resumed.ok()) continue;
      why = absl::Status(
          why.code(),
          absl::StrCat(why.message(), "; resuming the session failed: ", resumed.message()));
    }
    stream_.reset();
    channel_.reset();  // a draining daemon waits for its connections to close
    on_lost_(why);
    return;
  }
}

absl::Status AttachedSession::Resume() {
  const absl::Time give_up = absl::Now() + stream_->session_grace();
  absl::Duration backoff = absl::Milliseconds(50);
  while (true) {
    const absl::Duration left = std::max(give_up - absl::Now(), absl::Milliseconds(1));
    absl::Status s = OpenStream(resume_token_, std::min(options_.connect_timeout, left));
    if (s.ok()) {
      resume_token_ = stream_->resume_token();  // each token resumes once: keep the newest
      resumes_.fetch_add(1);
      return s;
    }
    const bool unreachable = absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
    if (!unreachable || over_unix() || absl::Now() + backoff >= give_up) return s;
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff)) return s;
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

}  // namespace kvarena::client_internal
