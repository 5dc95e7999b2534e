// KvCacheServiceImpl: the kvarena.v1.KvCacheService handlers. Each unary one passes the
// caller (its session: metadata `kvarena-session`, "" when absent; with --tenants_file
// the tenant its `authorization: Bearer` token names, else UNAUTHENTICATED) and the request to
// Requests (daemon/requests.h: decode -> KvStore -> encode) inside Serve, which times
// and counts the call (RpcMetrics) and maps the status (ToGrpcStatus): every unary call
// is dispatched through that one place. No rules and no locks live here: the store owns
// both. Attach and WatchEvents are on gRPC's callback API (a held stream takes no
// thread): the AttachHub and the EventsHub serve and count them.
//
// Thread-safety: handlers run concurrently on gRPC's sync-server threads.
#ifndef KVARENA_DAEMON_SERVICE_H_
#define KVARENA_DAEMON_SERVICE_H_

#include "core/kv_store.h"
#include "daemon/attach.h"
#include "daemon/events.h"
#include "daemon/requests.h"
#include "daemon/tenants.h"
#include "daemon/rpc_metrics.h"
#include "kvarena/v1/kvarena.grpc.pb.h"
#include "proto/wire.h"

namespace kvarena {

class KvCacheServiceImpl final
    : public v1::KvCacheService::WithCallbackMethod_Attach<
          v1::KvCacheService::WithCallbackMethod_WatchEvents<v1::KvCacheService::Service>> {
 public:
  // store, rpcs, attach, events and tenants (null: no --tenants_file) must outlive the
  // service.
  KvCacheServiceImpl(KvStore* store, RpcMetrics* rpcs, AttachHub* attach, EventsHub* events,
                     const Tenants* tenants = nullptr)
      : requests_(store), rpcs_(rpcs), attach_(attach), events_(events), tenants_(tenants) {}

  using Ctx = grpc::ServerContext;
  grpc::Status Allocate(Ctx*, const v1::AllocateRequest*, v1::AllocateResponse*) override;
  grpc::Status Append(Ctx*, const v1::AppendRequest*, v1::AppendResponse*) override;
  grpc::Status Attend(Ctx*, const v1::AttendRequest*, v1::AttendResponse*) override;
  grpc::Status Popn(Ctx*, const v1::PopnRequest*, v1::PopnResponse*) override;
  grpc::Status Reset(Ctx*, const v1::ResetRequest*, v1::ResetResponse*) override;
  grpc::Status Release(Ctx*, const v1::ReleaseRequest*, v1::ReleaseResponse*) override;
  grpc::Status Reserve(Ctx*, const v1::ReserveRequest*, v1::ReserveResponse*) override;
  grpc::Status Commit(Ctx*, const v1::CommitRequest*, v1::CommitResponse*) override;
  grpc::Status GetKv(Ctx*, const v1::GetKvRequest*, v1::GetKvResponse*) override;
  grpc::Status Describe(Ctx*, const v1::DescribeRequest*, v1::DescribeResponse*) override;
  grpc::Status Stats(Ctx*, const v1::StatsRequest*, v1::StatsResponse*) override;
  grpc::Status ListCaches(Ctx*, const v1::ListCachesRequest*, v1::ListCachesResponse*) override;
  grpc::ServerWriteReactor<v1::AttachEvent>* Attach(grpc::CallbackServerContext*,
                                                    const v1::AttachRequest*) override;
  grpc::Status Ping(Ctx*, const v1::PingRequest*, v1::PingResponse*) override;
  grpc::Status SetTokens(Ctx*, const v1::SetTokensRequest*, v1::SetTokensResponse*) override;
  grpc::Status Fork(Ctx*, const v1::ForkRequest*, v1::ForkResponse*) override;
  grpc::ServerWriteReactor<v1::WatchEventsResponse>* WatchEvents(grpc::CallbackServerContext*,
                                                                 const v1::WatchEventsRequest*) override;

 private:
  // The call's session and, with tenants, the tenant its bearer token names
  // (UNAUTHENTICATED without one).
  absl::StatusOr<Caller> CallerOf(const grpc::ServerContextBase* ctx) const;
  // Authenticates the caller, runs body (a Requests call) for it, records its status and
  // how long it took, and maps the status.
  template <typename Body>
  grpc::Status Serve(Rpc rpc, const grpc::ServerContextBase* ctx, Body body);

  Requests requests_;
  RpcMetrics* const rpcs_;
  AttachHub* const attach_;
  EventsHub* const events_;
  const Tenants* const tenants_;
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_SERVICE_H_
