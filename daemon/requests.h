// Requests: the body of every unary KvCacheService handler, free of gRPC's server types,
// so the service (daemon/service.cc), its tests and the fuzzer run exactly the same code:
// decode the request (daemon/decode.h: every wire integer range-checked before it
// narrows; tensor payloads through CallTensors), call one KvStore operation with the
// caller's session ("" for none), encode the reply. No rules and no locks live here:
// the store owns both. With tenants (--tenants_file), each call's ids, namespaces,
// replies and messages pass through the caller's TenantScope (daemon/tenant_scope.h), and
// a session another tenant opened is refused as unknown.
//
// Thread-safety: as KvStore — every method may run concurrently.
#ifndef KVARENA_DAEMON_REQUESTS_H_
#define KVARENA_DAEMON_REQUESTS_H_

#include <string>

#include "absl/status/status.h"
#include "core/kv_store.h"
#include "daemon/tenant_scope.h"
#include "kvarena/v1/kvarena.pb.h"

namespace kvarena {

class Requests {
 public:
  explicit Requests(KvStore* store) : store_(store) {}  // store must outlive this

  using S = const Caller&;
  absl::Status Allocate(S caller, const v1::AllocateRequest& req, v1::AllocateResponse* resp);
  absl::Status Append(S caller, const v1::AppendRequest& req, v1::AppendResponse* resp);
  // `stop` (may be null): the gRPC call's deadline and cancellation (KvStore::Attend).
  absl::Status Attend(S caller, const v1::AttendRequest& req, v1::AttendResponse* resp,
                      const StopToken* stop = nullptr);
  absl::Status Popn(S caller, const v1::PopnRequest& req, v1::PopnResponse* resp);
  absl::Status Reset(S caller, const v1::ResetRequest& req, v1::ResetResponse* resp);
  absl::Status Release(S caller, const v1::ReleaseRequest& req, v1::ReleaseResponse* resp);
  absl::Status Reserve(S caller, const v1::ReserveRequest& req, v1::ReserveResponse* resp);
  absl::Status Commit(S caller, const v1::CommitRequest& req, v1::CommitResponse* resp);
  absl::Status GetKv(S caller, const v1::GetKvRequest& req, v1::GetKvResponse* resp);
  absl::Status Describe(S caller, const v1::DescribeRequest& req, v1::DescribeResponse* resp);
  absl::Status Stats(S caller, const v1::StatsRequest& req, v1::StatsResponse* resp);
  absl::Status ListCaches(S caller, const v1::ListCachesRequest& req, v1::ListCachesResponse* resp);
  absl::Status SetTokens(S caller, const v1::SetTokensRequest& req, v1::SetTokensResponse* resp);
  absl::Status Fork(S caller, const v1::ForkRequest& req, v1::ForkResponse* resp);

 private:
  // The caller's session as core knows it: one another tenant opened becomes an id no
  // session has, so core refuses it as unknown.
  std::string SessionOf(const Caller& caller, const TenantScope& scope) const;
  // A cache id for core: the caller's, or for a tenant's "" one it picks (core's own
  // would fall outside the tenant's scope).
  std::string NewCacheId(const TenantScope& scope, const std::string& requested) const;

  KvStore* const store_;
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_REQUESTS_H_
