// KvCacheServiceImpl: the kvarena.v1.KvCacheService handlers. Each unary one passes the
// caller (its session: metadata `kvarena-session`, "" when absent; with --tenants_file
// the tenant its `authorization: Bearer` token names, else UNAUTHENTICATED) and the request to
// Requests (daemon/requests.h: decode -> KvStore -> encode) inside Serve, which times
// and counts the call (RpcMetrics) and maps the status (ToGrpcStatus): every unary call
// is dispatched through that one place. No rules and no locks live here: the store owns
// both. Every method is on gRPC's callback API, as the health service is: a short unary
// call runs on the thread that read its request (a sync handler would be handed to
// another thread, one wake-up more per call); one that may run long — an Append over
// more than kInlineAppendBytes, an Attend over more than kInlineAttendWork, an Allocate or
// SetTokens with more than kInlineTokens ids, a Reserve or Commit of more than kInlineItems
// caches, GetKv, ListCaches, and any Allocate with prompt_tokens when tiers are configured
// (its lookup may read a disk or a network that hangs) — is handed to the Offload pool, so
// gRPC's few callback threads keep reading and Health, Ping and Stats keep answering; so
// is any call on a cache a pooled call holds (BusyCaches), which would otherwise wait for
// that cache's lock on a callback thread. The pool refuses a call past max_queued_bytes.
// Attach and WatchEvents (a held stream takes no thread): the AttachHub and the EventsHub
// serve and count them.
//
// Thread-safety: handlers run concurrently on gRPC's callback threads and the pool's.
#ifndef KVARENA_DAEMON_SERVICE_H_
#define KVARENA_DAEMON_SERVICE_H_

#include <chrono>
#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "core/kv_store.h"
#include "daemon/arena_messages.h"
#include "daemon/attach.h"
#include "daemon/busy_caches.h"
#include "daemon/events.h"
#include "daemon/offload.h"
#include "daemon/requests.h"
#include "daemon/rpc_metrics.h"
#include "daemon/tenants.h"
#include "kvarena/v1/kvarena.grpc.pb.h"
#include "proto/wire.h"

namespace kvarena {

// An Append whose k and v payloads together exceed this many bytes runs on the pool.
inline constexpr uint64_t kInlineAppendBytes = uint64_t{256} << 10;
// An Attend whose q elements times (pos + queries) exceed this runs on the pool: a decode
// step over 8192 tokens at 32 q heads x 128 dims (about 1.5 ms on one core) runs inline.
inline constexpr uint64_t kInlineAttendWork = uint64_t{1} << 25;
// An Allocate (prompt_tokens) or SetTokens (token_ids) with more ids runs on the pool.
inline constexpr int kInlineTokens = 16384;
// A Reserve or Commit of more caches runs on the pool.
inline constexpr int kInlineItems = 256;
// The Offload pool's threads, and the default of --max_queued_bytes.
inline constexpr int kOffloadThreads = 256;
inline constexpr uint64_t kDefaultMaxQueuedBytes = uint64_t{1} << 30;

// Whether a request is small enough to run on gRPC's callback thread (any shape or
// value the handler would refuse counts as large; the handler then refuses it).
bool RunsInline(const v1::AppendRequest& req);
bool RunsInline(const v1::AttendRequest& req);
// `tiers`: tiers are configured, so a prompt's lookup may read them.
bool RunsInline(const v1::AllocateRequest& req, bool tiers);
bool RunsInline(const v1::SetTokensRequest& req);
bool RunsInline(const v1::ReserveRequest& req);
bool RunsInline(const v1::CommitRequest& req);

struct ServiceOptions {
  const Tenants* tenants = nullptr;  // null: no --tenants_file
  bool tiers = false;                // the store reads tiers (RunsInline of an Allocate)
  // --max_queued_bytes: the bytes the requests handed to the Offload pool may hold.
  uint64_t max_queued_bytes = kDefaultMaxQueuedBytes;
};

class KvCacheServiceImpl final : public v1::KvCacheService::CallbackService {
 public:
  // store, rpcs, attach, events and options.tenants must outlive the service. The
  // destructor waits for every call handed to the pool.
  KvCacheServiceImpl(KvStore* store, RpcMetrics* rpcs, AttachHub* attach, EventsHub* events,
                     const ServiceOptions& options = {});

  using Ctx = grpc::CallbackServerContext;
  using Unary = grpc::ServerUnaryReactor;
  Unary* Allocate(Ctx*, const v1::AllocateRequest*, v1::AllocateResponse*) override;
  Unary* Append(Ctx*, const v1::AppendRequest*, v1::AppendResponse*) override;
  Unary* Attend(Ctx*, const v1::AttendRequest*, v1::AttendResponse*) override;
  Unary* Popn(Ctx*, const v1::PopnRequest*, v1::PopnResponse*) override;
  Unary* Reset(Ctx*, const v1::ResetRequest*, v1::ResetResponse*) override;
  Unary* Release(Ctx*, const v1::ReleaseRequest*, v1::ReleaseResponse*) override;
  Unary* Reserve(Ctx*, const v1::ReserveRequest*, v1::ReserveResponse*) override;
  Unary* Commit(Ctx*, const v1::CommitRequest*, v1::CommitResponse*) override;
  Unary* GetKv(Ctx*, const v1::GetKvRequest*, v1::GetKvResponse*) override;
  Unary* Describe(Ctx*, const v1::DescribeRequest*, v1::DescribeResponse*) override;
  Unary* Stats(Ctx*, const v1::StatsRequest*, v1::StatsResponse*) override;
  Unary* ListCaches(Ctx*, const v1::ListCachesRequest*, v1::ListCachesResponse*) override;
  grpc::ServerWriteReactor<v1::AttachEvent>* Attach(Ctx*, const v1::AttachRequest*) override;
  Unary* Ping(Ctx*, const v1::PingRequest*, v1::PingResponse*) override;
  Unary* SetTokens(Ctx*, const v1::SetTokensRequest*, v1::SetTokensResponse*) override;
  Unary* Fork(Ctx*, const v1::ForkRequest*, v1::ForkResponse*) override;
  grpc::ServerWriteReactor<v1::WatchEventsResponse>* WatchEvents(
      Ctx*, const v1::WatchEventsRequest*) override;

 private:
  // The call's session and, with tenants, the tenant its bearer token names
  // (UNAUTHENTICATED without one).
  absl::StatusOr<Caller> CallerOf(const grpc::ServerContextBase* ctx) const;
  // The caches a call names (views into its request, which outlives the call).
  using CacheIds = absl::InlinedVector<absl::string_view, 1>;
  // Runs body (a Requests call, given the caller) and finishes the call with its status:
  // on this thread when `small` and no pooled call holds one of `caches`, else on the pool
  // (holding `caches` and req's bytes meanwhile), or refuses it when the pool is past
  // max_queued_bytes (Offload::Run). The call is timed from here.
  template <typename Body>
  Unary* Serve(Rpc rpc, Ctx* ctx, const google::protobuf::Message& req, bool small, CacheIds caches,
               Body body);
  // Authenticates the caller, runs body for it, records its status and how long it took
  // since `start`, and maps the status.
  template <typename Body>
  grpc::Status Run(Rpc rpc, const Ctx* ctx, std::chrono::steady_clock::time_point start,
                   Body& body);

  Requests requests_;
  RpcMetrics* const rpcs_;
  AttachHub* const attach_;
  EventsHub* const events_;
  const Tenants* const tenants_;
  const bool tiers_;
  // The replies made of many messages, each call's on one arena.
  ArenaMessages<v1::StatsRequest, v1::StatsResponse> stats_messages_;
  ArenaMessages<v1::DescribeRequest, v1::DescribeResponse> describe_messages_;
  ArenaMessages<v1::ListCachesRequest, v1::ListCachesResponse> list_messages_;
  BusyCaches busy_;
  Offload offload_;  // last: its destructor waits for the calls it runs
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_SERVICE_H_
