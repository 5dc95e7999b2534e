#include "client/remote_channel.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/grpc_status.h"
#include "proto/wire.h"

namespace kvarena::client_internal {

RemoteChannel::RemoteChannel(std::string address, const ClientOptions& options,
                             const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                             grpc::ChannelArguments args)
    : address_(std::move(address)),
      call_timeout_(options.call_timeout),
      max_message_bytes_(options.max_message_bytes) {
  // Connect checked the bound; get_kv pages its replies below it.
  args.SetMaxReceiveMessageSize(int(options.max_message_bytes));
  // Reconnect to a daemon back after a break within about a second, well inside a
  // session grace (gRPC's default backoff grows to two minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxSendMessageSize(int(options.max_message_bytes));
  auto stubs = std::make_shared<Stubs>();
  stubs->channel = grpc::CreateCustomChannel(address_, credentials, args);
  stubs->kv = v1::KvCacheService::NewStub(stubs->channel);
  stubs->health = grpc::health::v1::Health::NewStub(stubs->channel);
  stubs_ = std::move(stubs);
}

absl::Status RemoteChannel::CheckRequestSize(absl::string_view what, size_t bytes) const {
  if (bytes <= max_message_bytes_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      what, ": ", bytes, " bytes, over this client's max_message_bytes=", max_message_bytes_,
      "; nothing was sent (send fewer tokens per call, or raise ClientOptions::max_message_bytes "
      "up to the daemon's --max_message_bytes)"));
}

std::shared_ptr<const RemoteChannel::Stubs> RemoteChannel::GetStubs() const {
  if (fork_guard_.forked()) return nullptr;  // the parent's connection (fork_guard.h)
  absl::MutexLock lock(&mu_);
  return stubs_;
}

void RemoteChannel::Prepare(grpc::ClientContext* ctx) const {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + call_timeout_));
  // session_id_ is written once, before Connect returns.
  if (!session_id_.empty()) ctx->AddMetadata(kSessionMetadataKey, session_id_);
}

absl::Status RemoteChannel::Finish(const grpc::Status& status) const {
  absl::Status s = FromGrpcStatus(status);
  if (s.code() == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(absl::StrCat(s.message(), " [", address_, "]"));
  }
  return s;
}

absl::Status RemoteChannel::DisconnectedStatus() const {
  if (fork_guard_.forked()) return fork_guard_.ForkedStatus();
  if (connected()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return absl::UnavailableError(
      absl::StrCat(kUnavailablePrefix, "the session's Attach stream to ", address_, " ended (",
                   absl::StripPrefix(end_status_.message(), kUnavailablePrefix), "); session ",
                   SessionIdForLog(session_id_), " and its caches are gone; connect a new Client"));
}

void RemoteChannel::Disconnect(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  stubs_.reset();  // closes the channel once no call holds it
  end_status_ = why;
  connected_.store(false);
}

}  // namespace kvarena::client_internal
