// RemoteTransport: kvarenad over gRPC, the Transport of a "unix:PATH" or "HOST:PORT"
// address (NewRemoteTransport). Every unary call goes through one RemoteChannel
// (client/remote_channel.h); with options.attach the session is held by an Attach stream
// (AttachedSession, which resumes it on a new stream when one breaks), and its loss marks
// the transport disconnected for good. Over a unix: address it also connects to the
// daemon's fd socket (AttachEvent.fd_socket) through ZeroCopy: pools map into this
// process (MapPool: views and the local path) and q/k/v/out travel through the session's
// scratch region (ScratchLanes) unless options.inline_tensors.
//
// Private to the client library. The methods are defined by concern:
//   remote_transport.cc     setup: the channel, the session, the data plane, the device
//   remote_calls.cc         the calls that carry fields only: request built, reply decoded
//   remote_tensor_calls.cc  Append and Attend: tensors through a scratch lane or inline
//   remote_pool_calls.cc    Describe, Reserve and MapPool: the mapped pools kept up to date
//
// Thread-safety: NewRemoteTransport sets it up (Attach, LearnDevice, ConnectRegions)
// before sharing it; from then on every method may be called concurrently.
#ifndef KVARENA_CLIENT_REMOTE_TRANSPORT_H_
#define KVARENA_CLIENT_REMOTE_TRANSPORT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/attached_session.h"
#include "client/remote_channel.h"
#include "client/transport.h"
#include "client/zero_copy.h"

namespace kvarena::client_internal {

class RemoteTransport final : public Transport {
 public:
  // credentials and args: from NewChannelCredentials.
  RemoteTransport(std::string address, const ClientOptions& options,
                  const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                  grpc::ChannelArguments args);
  // The session goes first: its supervisor may call Disconnect, which uses channel_.
  ~RemoteTransport() override { session_.reset(); }

  // Set-up, before sharing: Attach and LearnDevice (with options.attach), then
  // ConnectRegions.
  // Opens the Attach stream and waits for its first event (the session id).
  absl::Status Attach();
  // The backend's name, as Stats reports it, turned into a device name.
  absl::Status LearnDevice();
  // Sets up the zero-copy data plane with the fd socket the first AttachEvent named.
  void ConnectRegions();

  const std::string& address() const override { return channel_.address(); }
  std::string session_id() const override { return channel_.session_id(); }
  bool is_inproc() const override { return false; }
  std::string device() override;
  int64_t resumes() const override { return session_ == nullptr ? 0 : session_->resumes(); }

  // remote_calls.cc
  absl::StatusOr<CacheInfo> Allocate(const CacheSpec& spec, const std::string& cache_id,
                                     const AllocateOptions& options) override;
  absl::StatusOr<CacheInfo> SetTokens(const SetTokensArgs& args) override;
  absl::StatusOr<CacheInfo> Fork(const std::string& cache_id,
                                 const std::string& new_cache_id) override;
  absl::StatusOr<PopnResult> Popn(const std::string& cache_id, int64_t n) override;
  absl::StatusOr<CacheInfo> Reset(const std::string& cache_id, bool keep_pages) override;
  absl::Status Release(const std::string& cache_id) override;
  absl::StatusOr<GetKvResult> GetKv(const std::string& cache_id, int layer,
                                    const GetKvRange& range) override;
  absl::StatusOr<std::vector<CacheInfo>> Commit(const std::vector<CacheTokens>& items) override;
  absl::StatusOr<ArenaStats> Stats() override;
  absl::StatusOr<PageStats> CacheStats(const std::string& cache_id) override;
  absl::StatusOr<std::vector<CacheInfo>> ListCaches() override;
  absl::StatusOr<ServingStatus> Health(const std::string& service) override;
  absl::Status Ping() override;

  // remote_tensor_calls.cc
  absl::StatusOr<AppendResult> Append(const std::string& cache_id, int layer, int64_t pos,
                                      const TensorArg& k, const TensorArg& v) override;
  absl::StatusOr<AttendResult> Attend(const AttendArgs& args, TensorOut* out) override;
  int TEST_QuarantinedLanes() const override { return zero_copy_->QuarantinedLanes(); }

  // remote_pool_calls.cc
  absl::StatusOr<CacheDescription> Describe(const std::string& cache_id) override;
  absl::StatusOr<std::vector<ReserveResult>> Reserve(
      const std::vector<CacheTokens>& items) override;
  absl::StatusOr<MappedPool> MapPool(uint64_t pool_id) override;

 protected:
  bool Connected() const override { return channel_.connected(); }
  absl::Status LostStatus() const override { return channel_.DisconnectedStatus(); }

 private:
  using Stub = RemoteChannel::Stub;

  // RESOURCE_EXHAUSTED (CheckRequestSize) when the present tensors' bytes, sent inline in
  // `request`, pass the message limit by themselves.
  absl::Status InlineFits(const char* request,
                          std::initializer_list<const TensorArg*> tensors) const;

  const ClientOptions options_;
  RemoteChannel channel_;

  absl::Mutex mu_;
  std::string device_ ABSL_GUARDED_BY(mu_);

  // Set once by ConnectRegions, before the transport is shared.
  std::unique_ptr<ZeroCopy> zero_copy_;
  // Set once by Attach(); null without a session.
  std::unique_ptr<AttachedSession> session_;
};

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_REMOTE_TRANSPORT_H_
