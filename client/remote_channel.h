// RemoteChannel: a remote client's one gRPC channel to kvarenad, its stubs, and the
// plumbing every unary call goes through. The channel has the credentials of
// client/channel_credentials.h and message limits both ways of options.max_message_bytes.
// A call carries a deadline of options.call_timeout and the session metadata, and its
// status comes back through FromGrpcStatus, an UNAVAILABLE one naming the address. When
// the session is lost, Disconnect lets the channel go for good: every call fails with
// DisconnectedStatus from then on. In a fork() child of the process that made it the
// channel is the parent's (client/fork_guard.h): every call fails with FAILED_PRECONDITION
// before touching it. A request larger than options.max_message_bytes is refused with
// RESOURCE_EXHAUSTED before it is serialized (CheckRequestSize).
//
// Kept apart from RemoteTransport so the per-RPC code (remote_calls.cc and its siblings)
// reads as request, Call, reply, with the connection's state in one place.
//
// Thread-safety: set_session_id once, before sharing; everything else is safe for
// concurrent use (a call in flight holds its own reference to the stubs).
#ifndef KVARENA_CLIENT_REMOTE_CHANNEL_H_
#define KVARENA_CLIENT_REMOTE_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "client/fork_guard.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvarena/client.h"
#include "kvarena/v1/kvarena.grpc.pb.h"

namespace kvarena::client_internal {

class RemoteChannel {
 public:
  using Stub = v1::KvCacheService::Stub;

  // One channel and its stubs, shared by the calls in flight.
  struct Stubs {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<Stub> kv;
    std::unique_ptr<grpc::health::v1::Health::Stub> health;
  };

  // credentials and args: from NewChannelCredentials.
  RemoteChannel(std::string address, const ClientOptions& options,
                const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                grpc::ChannelArguments args);
  RemoteChannel(const RemoteChannel&) = delete;
  RemoteChannel& operator=(const RemoteChannel&) = delete;

  const std::string& address() const { return address_; }
  // The session every call names in its metadata; empty without one.
  const std::string& session_id() const { return session_id_; }
  void set_session_id(std::string session_id) { session_id_ = std::move(session_id); }

  // One unary KvCacheService call: DisconnectedStatus once disconnected (or forked),
  // RESOURCE_EXHAUSTED for a request over the message limit (nothing sent), else the
  // call's status (Finish).
  template <typename Req, typename Resp>
  absl::Status Call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
                    const Req& req, Resp* resp) {
    std::shared_ptr<const Stubs> stubs = GetStubs();
    if (stubs == nullptr) return DisconnectedStatus();
    // ByteSizeLong sizes the message without serializing it: gRPC would serialize all of
    // it before its own check (seconds for 512 MiB) and abort the process past 2 GiB.
    KVARENA_RETURN_IF_ERROR(CheckRequestSize(Req::descriptor()->name(), req.ByteSizeLong()));
    grpc::ClientContext ctx;
    Prepare(&ctx);
    return Finish((stubs->kv.get()->*method)(&ctx, req, resp));
  }

  // RESOURCE_EXHAUSTED naming `what`, its bytes and the limit when a request of `bytes`
  // exceeds options.max_message_bytes (what this channel sends at most); OK otherwise.
  absl::Status CheckRequestSize(absl::string_view what, size_t bytes) const;
  size_t max_message_bytes() const { return max_message_bytes_; }

  // The stubs, or null once disconnected or in a fork() child. Calls hold their copy to
  // the end.
  std::shared_ptr<const Stubs> GetStubs() const;
  // Sets a call's deadline and session metadata.
  void Prepare(grpc::ClientContext* ctx) const;
  // A call's gRPC status as the client reports it.
  absl::Status Finish(const grpc::Status& status) const;

  // False once Disconnect ran (never flips back), and in a fork() child.
  bool connected() const { return connected_.load() && !fork_guard_.forked(); }
  // OK while connected; FAILED_PRECONDITION in a fork() child; else UNAVAILABLE naming
  // the address, why the session's Attach stream ended, and the session.
  absl::Status DisconnectedStatus() const;
  // The session is gone: calls fail with DisconnectedStatus from now on.
  void Disconnect(const absl::Status& why);

 private:
  const std::string address_;
  const absl::Duration call_timeout_;
  const size_t max_message_bytes_;
  const ForkGuard fork_guard_;

  std::string session_id_;  // set once by set_session_id, before the channel is shared
  std::atomic<bool> connected_{true};

  mutable absl::Mutex mu_;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  // Reset when the Attach stream ends: the connection closes and a draining daemon is
  // not kept waiting for it (it waits for its connections, not only for calls).
  std::shared_ptr<const Stubs> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_REMOTE_CHANNEL_H_
