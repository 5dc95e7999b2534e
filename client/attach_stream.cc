#include "client/attach_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/grpc_status.h"
#include "proto/wire.h"

namespace kvarena::client_internal {

AttachStream::AttachStream(std::shared_ptr<grpc::Channel> channel, std::function<void()> on_end)
    : on_end_(std::move(on_end)) {
  absl::MutexLock lock(&mu_);
  stub_ = v1::KvCacheService::NewStub(channel);
  channel_ = std::move(channel);
}

AttachStream::~AttachStream() {
  {
    absl::MutexLock lock(&mu_);
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
  if (reader_thread_.joinable()) reader_thread_.join();
}

absl::Status AttachStream::Open(const std::string& client_name, const std::string& resume_token,
                                bool wait_for_ready, absl::Duration timeout,
                                const std::string& address) {
  v1::AttachRequest req;
  req.set_client_name(client_name);
  req.set_resume_token(resume_token);
  absl::MutexLock lock(&mu_);
  ctx_ = std::make_unique<grpc::ClientContext>();
  // No deadline: the stream is held for good; the wait below gives up on the first event.
  ctx_->set_wait_for_ready(wait_for_ready);
  // The reader thread starts the call: waiting for the channel, it blocks until cancelled.
  reader_thread_ = std::thread([this, req] { ReadEvents(req); });
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !first_.session_id().empty() || done_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    if (ctx_ != nullptr) ctx_->TryCancel();
    return absl::UnavailableError(absl::StrCat(kUnavailablePrefix, "no session from ", address,
                                               " within ", absl::FormatDuration(timeout),
                                               " (Attach sent no event)"));
  }
  return first_.session_id().empty() ? end_status_ : absl::OkStatus();
}

std::string AttachStream::session_id() const {
  absl::MutexLock lock(&mu_);
  return first_.session_id();
}

std::string AttachStream::resume_token() const {
  absl::MutexLock lock(&mu_);
  return first_.resume_token();
}

absl::Duration AttachStream::session_grace() const {
  absl::MutexLock lock(&mu_);
  return absl::Milliseconds(first_.session_grace_ms());
}

std::string AttachStream::fd_socket() const {
  absl::MutexLock lock(&mu_);
  return first_.fd_socket();
}

bool AttachStream::ended() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

absl::Status AttachStream::end_status() const {
  absl::MutexLock lock(&mu_);
  return end_status_;
}

bool AttachStream::ended_by_shutdown() const {
  absl::MutexLock lock(&mu_);
  return ended_by_shutdown_;
}

void AttachStream::ReadEvents(const v1::AttachRequest& req) {
  grpc::ClientContext* ctx;
  v1::KvCacheService::Stub* stub;
  {
    absl::MutexLock lock(&mu_);
    ctx = ctx_.get();
    stub = stub_.get();
  }
  // Only this thread resets ctx_ and stub_; the constructor may also be cancelled through ctx_.
  std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> reader = stub->Attach(ctx, req);
  v1::AttachEvent event;
  while (reader->Read(&event)) {
    absl::MutexLock lock(&mu_);
    if (first_.session_id().empty()) {
      event.clear_regions();
      first_ = std::move(event);
    }
  }
  grpc::Status end = reader->Finish();
  bool shutdown = false;
  for (const auto& [key, value] : ctx->GetServerTrailingMetadata()) {
    shutdown |= key == kAttachEndMetadataKey && value == kAttachEndShutdown;
  }
  absl::Status why = end.ok() ? absl::UnavailableError(absl::StrCat(
                                    kUnavailablePrefix, "the daemon closed the Attach stream"))
                              : FromGrpcStatus(end);
  reader.reset();
  {
    absl::MutexLock lock(&mu_);
    // Drop the finished call and this object's hold on the channel now.
    ctx_.reset();
    stub_.reset();
    channel_.reset();
    end_status_ = why;
    ended_by_shutdown_ = shutdown;
    done_ = true;
  }
  on_end_();
}

}  // namespace kvarena::client_internal
