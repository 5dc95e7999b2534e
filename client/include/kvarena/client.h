// kvarena::Client: a worker's connection to the KV arena — a kvarenad daemon over gRPC
// ("unix:/tmp/kvarena.sock", "HOST:PORT") or a KvStore inside this process ("inproc:").
// Both run the same core code and answer through the same API.
//
// A remote client opens an Attach stream (when options.attach) and holds it for its
// lifetime: the daemon gives it a session id, every call carries it as the
// `kvarena-session` metadata, and caches it allocates belong to that session. When the
// stream breaks the client resumes the session on a new stream with the resume token the
// daemon gave it (ClientOptions::resume); when that fails (the daemon went away, shut
// down, or the grace ran out) the client is disconnected for good: its calls fail with
// UNAVAILABLE and its handles report is_valid() == false; connect a new Client. If the
// client process dies, the daemon releases its caches after --session_grace.
//
// Over a unix: address an attached client also maps the daemon's memory through its fd
// socket (AttachEvent.fd_socket): pool views (key_cache, ...) and the local path work as
// inproc, and attention / append send q/k/v and receive out through the session's scratch
// region instead of inline bytes. Over TCP tensors travel inline and pools are not mapped.
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
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvarena/kv_cache_handle.h"
#include "kvarena/types.h"

namespace kvarena {

namespace client_internal {
class ClientTestPeer;
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
  // When the Attach stream breaks other than by the daemon shutting down, open a new one
  // with the session's resume token, keeping the session and its caches: over TCP retried
  // until the daemon's --session_grace (which it announces) runs out, over a Unix socket
  // tried once (a daemon that cannot be reached there is gone). Calls made meanwhile may
  // fail UNAVAILABLE; connected() stays true until resuming fails.
  bool resume = true;

  // Send tensors as inline bytes even where the scratch region is mapped (tests and
  // benchmarks compare the two); pools are still mapped.
  bool inline_tensors = false;
  // CPU threads of the local path's kernels (attention_local), and of the in-process
  // store for inproc:. -1: one per core.
  int num_threads = -1;
  // The largest gRPC message this client sends or receives (for inproc:, the largest
  // GetKv reply its store gives, as kvarenad's --max_message_bytes does). Keep it at most
  // the daemon's --max_message_bytes: get_kv pages a layer in GetKv calls of at most
  // min(4 MiB, half of this) of K and V. Connect takes 64 KiB .. 2 GiB - 1.
  size_t max_message_bytes = size_t{64} << 20;

  // inproc: only — the in-process store's budget and default page size.
  size_t arena_bytes = size_t{256} << 20;
  int page_size = 16;

  // HOST:PORT only (Connect refuses them for unix: and inproc:, which file permissions
  // guard; a unix: address takes auth_token or auth_token_file alone, a tenant's token for
  // a daemon with --tenants_file): the daemon's --tls_cert / --tls_client_ca /
  // --auth_token_file / --tenants_file counterparts.
  // TLS is on when tls_ca_file is set: the daemon's certificate must chain to this PEM CA
  // bundle and carry the address's host (or tls_target_name) in its names.
  std::string tls_ca_file;
  // Mutual TLS: this client's PEM certificate chain and private key; both or neither.
  std::string tls_cert_file;
  std::string tls_key_file;
  // The name the daemon's certificate must carry instead of the address's host (tests;
  // an address by IP whose certificate names only a DNS name).
  std::string tls_target_name;
  // A bearer token sent as `authorization: Bearer <token>` on every call; needs TLS over
  // TCP. At
  // most one of auth_token and auth_token_file (read at Connect, surrounding whitespace
  // dropped).
  std::string auth_token;
  std::string auth_token_file;
};

// Calls this client made that a decode loop on the local path should make rarely: Reserve
// (one per page boundary per batch), Commit (one per step per batch) and Describe (none
// per step). RPCs for a remote client; store calls for inproc.
struct CallCounts {
  int64_t reserve = 0;
  int64_t commit = 0;
  int64_t describe = 0;
};

// A cache and a token count, for the batched local-path calls.
using CacheTokenList = std::vector<std::pair<std::shared_ptr<GenericKvCacheHandle>, int64_t>>;

// What logs and messages may show of a session id: its first 8 characters and "…".
std::string SessionIdForLog(const std::string& session_id);

// grpc.health.v1 HealthCheckResponse.ServingStatus.
enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };
// "UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" (the names grpc_health_probe prints).
const char* ServingStatusName(ServingStatus s);

class Client {
 public:
  // address: "unix:PATH", "HOST:PORT" or "inproc:". Fails with UNAVAILABLE when the
  // daemon cannot be reached within options.connect_timeout (a failed TLS handshake
  // included), UNAUTHENTICATED when it wants a bearer token this client lacks or got
  // wrong, INVALID_ARGUMENT for an options.max_message_bytes out of range or TLS / token
  // options that do not fit together or the address; a file that cannot be read: its
  // errno's code, naming the option.
  static absl::StatusOr<std::shared_ptr<Client>> Connect(const std::string& address,
                                                         const ClientOptions& options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& address() const;
  // The Attach session ("" without one). A credential: whoever holds it acts as this
  // session, so print SessionIdForLog(id), never the id.
  std::string session_id() const;
  bool is_inproc() const;
  // False once the session is gone: the daemon went away or its Attach stream broke and
  // could not be resumed (never true again).
  bool connected() const;
  // How many times the session was resumed after its Attach stream broke.
  int64_t resumes() const;

  // A new cache; cache_id "" lets the arena pick one. ALREADY_EXISTS when the id is taken.
  // options.prompt_tokens: the token ids of the prompt; with spec.prefix_namespace the
  // cache starts with the longest cached prefix of it already filled on every layer
  // (handle->cached_tokens(), a multiple of page_size below the prompt's length): compute
  // positions from there on (docs/prefix-reuse.md).
  absl::StatusOr<std::shared_ptr<GenericKvCacheHandle>> Allocate(
      const CacheSpec& spec, const std::string& cache_id = "", const AllocateOptions& options = {});
  // A handle to an existing cache (one this session owns, or one with no session).
  absl::StatusOr<std::shared_ptr<GenericKvCacheHandle>> OpenCache(const std::string& cache_id);
  // Releases a cache by id (what handle->release() does, without a handle; it too first
  // waits for this client's local kernels: see "Page lifetime" in kv_cache_handle.h).
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

  // --- local path, batched (see GenericKvCacheHandle::reserve / commit) ---
  // Makes room for the next n tokens of every listed cache: one Reserve RPC for all the
  // caches whose held pages do not already cover them (each asks for at least its
  // reserve_ahead, to the next page boundary), none when all have room. All or nothing.
  // INVALID_ARGUMENT for a handle of another client or a cache listed twice.
  absl::Status Reserve(const CacheTokenList& items);
  // Commits n tokens written through the mapping on every layer of each cache, in one
  // Commit RPC; the handles drop the pages a sliding window evicted (so, when a listed
  // cache has a sliding layer, it first waits for this client's local kernels).
  absl::Status Commit(const CacheTokenList& items);
  CallCounts call_counts() const;

 private:
  friend class client_internal::ClientTestPeer;  // test hooks (client/client_test_peer.h)

  explicit Client(std::shared_ptr<client_internal::Transport> transport);
  std::shared_ptr<client_internal::Transport> transport_;
};

}  // namespace kvarena

#endif  // KVARENA_CLIENT_INCLUDE_KVARENA_CLIENT_H_
