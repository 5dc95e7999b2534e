#include "kvarena/client.h"

#include <climits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/cache_state.h"
#include "client/channel_credentials.h"
#include "client/transport.h"
#include "core/refusal.h"

namespace kvarena {

using client_internal::CacheState;
using client_internal::Transport;

namespace {
// ClientOptions::max_message_bytes: below 64 KiB even small calls stop fitting; gRPC
// takes the limit as an int.
constexpr size_t kMinMessageBytes = size_t{64} << 10;
constexpr size_t kMaxMessageBytes = size_t{INT_MAX};
}  // namespace

std::string SessionIdForLog(const std::string& session_id) {
  if (session_id.empty()) return "";
  return absl::StrCat(session_id.substr(0, 8), "\u2026");  // "…"
}

const char* ServingStatusName(ServingStatus s) {
  switch (s) {
    case ServingStatus::kServing:
      return "SERVING";
    case ServingStatus::kNotServing:
      return "NOT_SERVING";
    case ServingStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
    case ServingStatus::kUnknown:
      break;
  }
  return "UNKNOWN";
}

absl::StatusOr<std::shared_ptr<Client>> Client::Connect(const std::string& address,
                                                        const ClientOptions& options) {
  if (address.empty()) {
    return absl::InvalidArgumentError(
        "Connect: empty address; want unix:PATH, HOST:PORT or inproc:");
  }
  const size_t limit = options.max_message_bytes;
  if (limit < kMinMessageBytes || limit > kMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("Connect: max_message_bytes=", limit,
                                                   " is outside [", kMinMessageBytes, ", ",
                                                   kMaxMessageBytes, "]"));
  }
  const bool inproc = address == kInprocAddress || address == "inproc";
  if (inproc && client_internal::HasTcpSecurity(options)) {
    return absl::InvalidArgumentError(
        "Connect: tls_* and auth_token options apply to HOST:PORT addresses, not inproc:");
  }
  absl::StatusOr<std::shared_ptr<Transport>> t =
      inproc ? client_internal::NewInprocTransport(options)
             : client_internal::NewRemoteTransport(address, options);
  KVARENA_RETURN_IF_ERROR(t.status());
  return std::shared_ptr<Client>(new Client(*std::move(t)));
}

Client::Client(std::shared_ptr<Transport> transport) : transport_(std::move(transport)) {}
Client::~Client() = default;

const std::string& Client::address() const { return transport_->address(); }
std::string Client::session_id() const { return transport_->session_id(); }
bool Client::is_inproc() const { return transport_->is_inproc(); }
bool Client::connected() const { return transport_->connected(); }
int64_t Client::resumes() const { return transport_->resumes(); }

absl::StatusOr<std::shared_ptr<GenericKvCacheHandle>> Client::Allocate(
    const CacheSpec& spec, const std::string& cache_id, const AllocateOptions& options) {
  if (!connected()) return transport_->DisconnectedStatus();
  KVARENA_ASSIGN_OR_RETURN(auto info, transport_->Allocate(spec, cache_id, options));
  auto state = std::make_shared<CacheState>(info);
  if (info.seq_len == 0) state->MarkEmpty();  // else the adopted pages load with Describe
  return std::shared_ptr<GenericKvCacheHandle>(
      new GenericKvCacheHandle(transport_, std::move(info), std::move(state), -1));
}

absl::StatusOr<std::shared_ptr<GenericKvCacheHandle>> Client::OpenCache(
    const std::string& cache_id) {
  if (!connected()) return transport_->DisconnectedStatus();
  KVARENA_ASSIGN_OR_RETURN(auto d, transport_->Describe(cache_id));
  auto state = std::make_shared<CacheState>(d.info);
  state->Load(d);
  return std::shared_ptr<GenericKvCacheHandle>(
      new GenericKvCacheHandle(transport_, std::move(d.info), std::move(state), -1));
}

absl::Status Client::Release(const std::string& cache_id) {
  if (!connected()) return transport_->DisconnectedStatus();
  if (absl::Status s = transport_->SynchronizeLocalKernels(); !s.ok()) {
    return Annotated(s, absl::StrCat("release: cache ", cache_id, ": "));
  }
  return transport_->Release(cache_id);
}

absl::StatusOr<ArenaStats> Client::Stats() {
  if (!connected()) return transport_->DisconnectedStatus();
  return transport_->Stats();
}

absl::StatusOr<PageStats> Client::CacheStats(const std::string& cache_id) {
  if (!connected()) return transport_->DisconnectedStatus();
  return transport_->CacheStats(cache_id);
}

absl::StatusOr<std::vector<CacheInfo>> Client::ListCaches() {
  if (!connected()) return transport_->DisconnectedStatus();
  return transport_->ListCaches();
}

absl::StatusOr<ServingStatus> Client::Health(const std::string& service) {
  if (!connected()) return transport_->DisconnectedStatus();
  return transport_->Health(service);
}

absl::Status Client::Ping() {
  if (!connected()) return transport_->DisconnectedStatus();
  return transport_->Ping();
}

}  // namespace kvarena
