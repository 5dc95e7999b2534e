// kvarena::Client: a worker's connection to the KV arena — a kvarenad daemon over gRPC
// ("unix:/tmp/kvarena.sock", "HOST:PORT") or a KvStore inside this process ("inproc:").
// Both run the same core code and answer through the same API.
//
// A remote client opens an Attach stream (when options.attach) and holds it for its
// lifetime: the daemon gives it a session id, every call carries it as the
// `kvarena-session` metadata, and caches it allocates belong to that session. When the
// stream breaks (the daemon went away) the client is disconnected for good: its calls
// fail with UNAVAILABLE and its handles report is_valid() == false; connect a new Client.
// If the client process dies, the daemon releases its caches after --session_grace.
//
// Thread-safety: a Client is safe for concurrent use from many threads; so are the
// handles it returns. Handles keep the connection alive: it closes once the Client and
// every handle from it are gone.
//
// Errors are absl::Status with the daemon's codes (see DESIGN.md): INVALID_ARGUMENT,
// NOT_FOUND, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, PERMISSION_DENIED, UNAVAILABLE
// ("kvarena daemon unavailable: ..."), DEADLINE_EXCEEDED (options.call_timeout).
#ifndef KVARENA_CLIENT_INCLUDE_KVARENA_CLIENT_H_
#define KVARENA_CLIENT_INCLUDE_KVARENA_CLIENT_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/types.h"
#include "kvarena/kv_cache_handle.h"

namespace kvarena {

namespace client_internal {
class Transport;
}  // namespace client_internal

inline constexpr char kDefaultAddress[] = "unix:/tmp/kvarena.sock";
inline constexpr char kInprocAddress[] = "inproc:";

struct ClientOptions {
  // Sent in Attach; the daemon shows it in logs and metrics.
  std::string client_name = "kvarena-client";
  // Deadline of every unary call.
  absl::Duration call_timeout = absl::Seconds(30);
  // How long Connect waits for the channel and the Attach stream's first event.
  absl::Duration connect_timeout = absl::Seconds(5);
  // Open a session (Attach). Without one, caches this client allocates belong to no
  // session and outlive it until released; tools (the CLI) that only read stats set false.
  bool attach = true;

  // inproc: only — the in-process store's budget, default page size and CPU threads.
  size_t arena_bytes = size_t{256} << 20;
  int page_size = 16;
  int num_threads = -1;  // -1: one per core
};

// grpc.health.v1 HealthCheckResponse.ServingStatus.
enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };
// "UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" (the names grpc_health_probe prints).
const char* ServingStatusName(ServingStatus s);

class Client {
 public:
  // address: "unix:PATH", "HOST:PORT" or "inproc:". Fails with UNAVAILABLE when the
  // daemon cannot be reached within options.connect_timeout.
  static absl::StatusOr<std::shared_ptr<Client>> Connect(const std::string& address,
                                                         const ClientOptions& options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& address() const;
  // The Attach session ("" without one).
  std::string session_id() const;
  bool is_inproc() const;
  // False once the daemon went away (never true again).
  bool connected() const;

  // A new cache; cache_id "" lets the arena pick one. ALREADY_EXISTS when the id is taken.
  absl::StatusOr<std::shared_ptr<GenericKvCacheHandle>> Allocate(
      const CacheSpec& spec, const std::string& cache_id = "");
  // A handle to an existing cache (one this session owns, or one with no session).
  absl::StatusOr<std::shared_ptr<GenericKvCacheHandle>> OpenCache(const std::string& cache_id);
  // Releases a cache by id (what handle->release() does, without a handle).
  absl::Status Release(const std::string& cache_id);

  // The whole arena: pages totals, per-pool rows, bytes, caches, sessions.
  absl::StatusOr<ArenaStats> Stats();
  // One cache's pages; NOT_FOUND once it is released.
  absl::StatusOr<PageStats> CacheStats(const std::string& cache_id);
  absl::StatusOr<std::vector<CacheInfo>> ListCaches();
  // grpc.health.v1.Health/Check for `service` ("" = the server as a whole).
  absl::StatusOr<ServingStatus> Health(const std::string& service = "");
  // The empty RPC (the benchmarks' baseline).
  absl::Status Ping();

 private:
  explicit Client(std::shared_ptr<client_internal::Transport> transport);
  std::shared_ptr<client_internal::Transport> transport_;
};

}  // namespace kvarena

#endif  // KVARENA_CLIENT_INCLUDE_KVARENA_CLIENT_H_
