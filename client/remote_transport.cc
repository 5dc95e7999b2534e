// RemoteTransport's set-up (client/remote_transport.h): the channel, then with
// options.attach the session held by an Attach stream and the device its backend names,
// then the zero-copy data plane over the fd socket the session's first event named. The
// calls themselves live in remote_calls.cc, remote_tensor_calls.cc and
// remote_pool_calls.cc.
#include "client/remote_transport.h"

#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "arena/region.h"
#include "base/status_macros.h"
#include "client/channel_credentials.h"

namespace kvarena::client_internal {

RemoteTransport::RemoteTransport(std::string address, const ClientOptions& options,
                                 const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                 grpc::ChannelArguments args)
    : Transport(options),
      options_(options),
      channel_(std::move(address), options, credentials, std::move(args)) {}

absl::Status RemoteTransport::Attach() {
  session_ = std::make_unique<AttachedSession>(
      channel_.GetStubs()->channel, channel_.address(), options_,
      [this](const absl::Status& why) { channel_.Disconnect(why); });
  KVARENA_RETURN_IF_ERROR(session_->Open());
  channel_.set_session_id(session_->session_id());
  return absl::OkStatus();
}

void RemoteTransport::ConnectRegions() {
  if (!options_.attach) {
    zero_copy_ = std::make_unique<ZeroCopy>("the client has no session (attach=false)");
    return;
  }
  zero_copy_ = ZeroCopy::Connect(channel_.address(), session_->fd_socket(), channel_.session_id(),
                                 options_.inline_tensors);
}

absl::Status RemoteTransport::LearnDevice() {
  KVARENA_ASSIGN_OR_RETURN(auto st, Stats());
  absl::MutexLock lock(&mu_);
  device_ = BackendDevice(st.backend);
  return absl::OkStatus();
}

std::string RemoteTransport::device() {
  {
    absl::MutexLock lock(&mu_);
    if (!device_.empty()) return device_;
  }
  absl::Status s = LearnDevice();
  absl::MutexLock lock(&mu_);
  return device_.empty() ? absl::StrCat("unknown (", s.message(), ")") : device_;
}

namespace {

// The process whose first remote client started gRPC in this address space (0: none yet).
// A fork() child inherits gRPC's runtime mid-flight — its epoll set, shared with the
// parent, and the bookkeeping of poller, timer and executor threads the child does not
// have — and gRPC 1.51 cannot reset it while a thread of the parent is inside gRPC (the
// Attach stream's reader always is). A channel made in the child then polls the parent's
// epoll set: it hangs, and takes readiness events the parent waits for, whose calls end
// DEADLINE_EXCEEDED. So a child may not connect at all.
std::atomic<int> grpc_started_in{0};

absl::Status CheckNotForkedFromGrpc() {
  const int pid = int(getpid());
  int started = 0;
  if (grpc_started_in.compare_exchange_strong(started, pid) || started == pid) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "Connect: this process (pid ", pid, ") is a fork() child of pid ", started,
      ", whose gRPC runtime it inherited and cannot use without stalling the parent's calls; "
      "connect from a process started with exec (multiprocessing's 'spawn' or 'forkserver', "
      "subprocess) instead"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<Transport>> NewRemoteTransport(const std::string& address,
                                                              const ClientOptions& options) {
  KVARENA_RETURN_IF_ERROR(CheckNotForkedFromGrpc());
  grpc::ChannelArguments args;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      NewChannelCredentials(address, options, &args);
  KVARENA_RETURN_IF_ERROR(credentials.status());
  std::shared_ptr<RemoteTransport> t(
      new RemoteTransport(address, options, *credentials, std::move(args)), DeleteTransport);
  if (options.attach) {
    KVARENA_RETURN_IF_ERROR(t->Attach());
    KVARENA_RETURN_IF_ERROR(t->LearnDevice());
  }
  t->ConnectRegions();
  return std::shared_ptr<Transport>(std::move(t));
}

}  // namespace kvarena::client_internal
