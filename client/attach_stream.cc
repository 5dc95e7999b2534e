#include "client/attach_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/grpc_status.h"

namespace kvarena::client_internal {

AttachStream::AttachStream(std::shared_ptr<grpc::Channel> channel,
                           std::function<void(const absl::Status&)> on_end)
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

absl::Status AttachStream::Open(const std::string& client_name, absl::Duration timeout,
                                const std::string& address) {
  v1::AttachRequest req;
  req.set_client_name(client_name);
  absl::MutexLock lock(&mu_);
  ctx_ = std::make_unique<grpc::ClientContext>();
  reader_ = stub_->Attach(ctx_.get(), req);
  reader_thread_ = std::thread([this] { ReadEvents(); });
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !session_.empty() || done_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    if (ctx_ != nullptr) ctx_->TryCancel();
    return absl::UnavailableError(absl::StrCat(kUnavailablePrefix, "no session from ", address,
                                               " within ", absl::FormatDuration(timeout),
                                               " (Attach sent no event)"));
  }
  return session_.empty() ? end_status_ : absl::OkStatus();
}

std::string AttachStream::session_id() const {
  absl::MutexLock lock(&mu_);
  return session_;
}

std::string AttachStream::fd_socket() const {
  absl::MutexLock lock(&mu_);
  return fd_socket_;
}

void AttachStream::ReadEvents() {
  grpc::ClientReader<v1::AttachEvent>* reader;
  {
    absl::MutexLock lock(&mu_);
    reader = reader_.get();
  }
  v1::AttachEvent event;
  while (reader->Read(&event)) {
    absl::MutexLock lock(&mu_);
    if (session_.empty()) {
      session_ = event.session_id();
      fd_socket_ = event.fd_socket();
    }
  }
  grpc::Status end = reader->Finish();
  absl::Status why = end.ok() ? absl::UnavailableError(absl::StrCat(
                                    kUnavailablePrefix, "the daemon closed the Attach stream"))
                              : FromGrpcStatus(end);
  {
    absl::MutexLock lock(&mu_);
    // Drop the finished call and this object's hold on the channel now.
    reader_.reset();
    ctx_.reset();
    stub_.reset();
    channel_.reset();
    end_status_ = why;
    done_ = true;
  }
  on_end_(why);
}

}  // namespace kvarena::client_internal
