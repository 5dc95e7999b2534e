#include "daemon/flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/byte_size.h"
#include "daemon/socket_access.h"

// CMake defines it from project(VERSION) (daemon/CMakeLists.txt); Bazel has no version.
#ifndef KVARENA_VERSION
#define KVARENA_VERSION "(unversioned: not built by CMake)"
#endif

namespace {
// Every flag's default is its option's (daemon/server.h, core/kv_store.h): one place each.
const kvarena::DaemonOptions kDefaults;
}  // namespace

ABSL_FLAG(std::vector<std::string>, listen, kDefaults.listen,
          "Where to serve, comma separated: unix:PATH (stale socket files are replaced; mode "
          "and group: --socket_mode, --socket_group) and/or HOST:PORT (plaintext unless "
          "--tls_cert).");
ABSL_FLAG(std::string, backend, kDefaults.backend,
          "Memory backend: host (memfd, CPU kernels), cuda (device 0: VMM / IPC regions, "
          "CUDA kernels; exits with an error where the build has no CUDA or no device is "
          "usable) or auto (cuda when usable, else host).");
ABSL_FLAG(kvarena::ByteSize, arena_bytes, kvarena::ByteSize{kDefaults.store.arena_bytes},
          "Arena budget every pool draws from: bytes, or with a unit K/M/G/T (1000s) or "
          "Ki/Mi/Gi/Ti (1024s), e.g. 512Mi.");
// The daemon keeps chunks warm where the store's default keeps none
// (bench/notes/2026-12-05-warm-arena.md): 256 MiB holds a 2k-token prefix of a 32-layer,
// 8-kv-head, head_dim-128 f16 model.
ABSL_FLAG(kvarena::ByteSize, arena_warm_bytes, kvarena::ByteSize{size_t{256} << 20},
          "Empty chunks every pool together keeps committed and resident (beyond one per "
          "pool) instead of giving them back to the system, so that a load or an append "
          "writes pages already faulted in; they still give way to any other use of "
          "--arena_bytes, and keep an idle pool alive. 0: give every other empty chunk back.");
ABSL_FLAG(bool, arena_prefault, true,
          "Fault a chunk's pages in when it is committed, in one call (MADV_POPULATE_WRITE on "
          "the host backend), instead of one page fault per page as caches first write them.");
ABSL_FLAG(int, page_size, kDefaults.store.default_page_size,
          "Tokens per page for caches whose spec leaves page_size 0.");
ABSL_FLAG(absl::Duration, session_grace, kDefaults.session_grace,
          "How long a session's caches outlive its broken Attach stream (e.g. 5s, 500ms).");
ABSL_FLAG(int, metrics_port, kDefaults.metrics_port,
          "Serve Prometheus metrics on --metrics_address:PORT/metrics; 0 = off.");
ABSL_FLAG(std::string, metrics_address, kDefaults.metrics_address,
          "The IP address the metrics endpoint binds: loopback by default; 0.0.0.0 (or ::) "
          "to let other hosts scrape it.");
ABSL_FLAG(int, num_threads, kDefaults.store.num_threads,
          "CPU attention worker threads, besides the thread serving the call, which joins them; "
          "-1 = one per core in all (cores - 1 workers).");
ABSL_FLAG(absl::Duration, cpu_pool_awake, kDefaults.store.cpu_pool_awake,
          "How long an idle CPU attention worker stays awake (spinning, then yielding its core) "
          "before it sleeps, in [0, 1s]. Longer spares a served call the worker's wake-up, "
          "which costs more on a VM; meanwhile the worker keeps a core busy.");
ABSL_FLAG(std::string, fd_socket, kDefaults.fd_socket,
          "Unix socket that hands pool and scratch-region fds to attached workers (zero-copy "
          "data plane). Empty = the first unix: --listen path + \".fds\" (none when there is "
          "no unix: address); \"none\" = off.");

ABSL_FLAG(kvarena::SocketMode, socket_mode, kvarena::SocketMode{0660},
          "Permission bits (octal) of every Unix socket kvarenad creates, the fd socket "
          "included; must include 0600.");
ABSL_FLAG(std::string, socket_group, "",
          "Group (a name or a gid) of every Unix socket kvarenad creates; empty = the group "
          "it is created with (kvarenad's).");
ABSL_FLAG(kvarena::UidList, allowed_uids, kvarena::UidList{},
          "Comma-separated uids that may fetch memory fds from the fd socket besides "
          "kvarenad's own; empty = kvarenad's uid and root. When set: exactly those uids and "
          "kvarenad's own (root only if listed).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain for the HOST:PORT listeners: they serve TLS (needs --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: HOST:PORT clients must present a certificate it signed (mutual TLS).");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding a bearer token (16+ visible ASCII bytes): every call on a HOST:PORT "
          "listener must carry 'authorization: Bearer <token>', else UNAUTHENTICATED. Needs "
          "--tls_cert. Unix sockets are guarded by file mode and group instead.");

ABSL_FLAG(std::string, tenants_file, "",
          "File of tenants, one a line: 'NAME TOKEN_FILE [max_sessions=N] [max_caches=N] "
          "[max_pages=N] [max_metadata_bytes=BYTES]' (bounds on what the tenant holds at "
          "once; metadata: an equal share of --metadata_bytes unless given), or 'NAME "
          "TOKEN_FILE role=operator' (a read-only view of all); '#' comments. Every KvCacheService "
          "call on every listener must then carry "
          "'authorization: Bearer <token>' of a tenant (UNAUTHENTICATED otherwise), and sees "
          "only that tenant's caches, sessions, namespaces and events. Health and reflection "
          "stay open. Excludes --auth_token_file.");

ABSL_FLAG(kvarena::ByteSize, max_message_bytes, kvarena::ByteSize{kDefaults.store.max_reply_bytes},
          "Largest gRPC message kvarenad receives or sends; a GetKv reply larger than this is "
          "refused (RESOURCE_EXHAUSTED): page it with from_pos / max_tokens.");
ABSL_FLAG(kvarena::ByteSize, max_queued_bytes, kvarena::ByteSize{kDefaults.max_queued_bytes},
          "Bytes of requests the daemon's pool of long calls (prefill Appends, long Attends, "
          "GetKv, ListCaches, Allocates that read the tiers) may hold, waiting or running; a "
          "call past it is refused (RESOURCE_EXHAUSTED naming max_queued_bytes), unless the "
          "pool holds none.");
ABSL_FLAG(kvarena::ByteSize, scratch_bytes, kvarena::ByteSize{kDefaults.store.scratch_bytes},
          "Scratch region per attached session (zero-copy tensors), charged to "
          "--arena_bytes while the session lives; 0 = none (tensors travel inline).");
ABSL_FLAG(kvarena::ByteSize, metadata_bytes, kvarena::ByteSize{kDefaults.store.metadata_bytes},
          "Bookkeeping requests may make kvarenad hold besides the arena: caches' per-layer "
          "tables, declared token ids (prompt_tokens, SetTokens, Fork) and prefix-index nodes. "
          "A request beyond it is refused (RESOURCE_EXHAUSTED naming metadata_bytes).");
ABSL_FLAG(kvarena::ByteSize, session_metadata_bytes,
          kvarena::ByteSize{kDefaults.store.session_metadata_bytes},
          "One session's share of --metadata_bytes (the caches allocated without a session "
          "count as one session); 0 = no share beyond --metadata_bytes (or its tenant's).");
ABSL_FLAG(kvarena::ByteSize, cached_metadata_bytes,
          kvarena::ByteSize{kDefaults.store.cached_metadata_bytes},
          "What prefixes no cache holds any more (cached for reuse) may keep of "
          "--metadata_bytes; past it, or when a request finds the budget full, the least "
          "recently cached are evicted. 0 = half of --metadata_bytes.");
ABSL_FLAG(kvarena::ByteSize, event_log_bytes, kvarena::ByteSize{kDefaults.store.prefix_event_bytes},
          "Most bytes of prefix-index events kept for WatchEvents replay (the oldest go "
          "first; a watcher asking for them learns events_lost).");
ABSL_FLAG(int, max_pools, kDefaults.store.max_pools,
          "Most pools (distinct geometries) alive at once; an empty pool is destroyed.");
ABSL_FLAG(int64_t, max_sessions, kDefaults.store.max_sessions,
          "Most sessions, attached or in their grace period.");
ABSL_FLAG(int64_t, max_caches, kDefaults.store.max_caches, "Most caches alive at once.");
ABSL_FLAG(int64_t, max_caches_per_session, kDefaults.store.max_caches_per_session,
          "Most caches one session may hold (caches allocated without a session count as "
          "one session, here and for --session_max_pages).");
ABSL_FLAG(int64_t, session_max_pages, kDefaults.store.session_max_pages,
          "Most pages the caches of one session may hold; 0 = no quota beyond the arena.");
ABSL_FLAG(int64_t, max_request_tokens, kDefaults.store.max_request_tokens,
          "Most tokens one Append / Attend / Reserve / Commit item may carry.");
ABSL_FLAG(int64_t, max_attend_work, kDefaults.store.max_attend_work,
          "Most work one served Attend may ask for: queries x keys it may see (past + new, "
          "or the window) x q heads; above it the call is refused (RESOURCE_EXHAUSTED) before "
          "anything is appended. The default (2^37) passes an 8k-token prefill chunk over a "
          "128k context at 64 q heads. An Attend also stops, its append undone, when its "
          "caller cancels or its deadline passes.");
ABSL_FLAG(absl::Duration, idle_ttl, kDefaults.store.idle_ttl,
          "Release caches allocated without a session after this long untouched; 0 = never.");
ABSL_FLAG(int, max_attach_per_peer, kDefaults.max_attach_per_peer,
          "Most Attach streams one TCP peer address may hold open (Unix-socket peers count "
          "against --max_sessions only).");
ABSL_FLAG(int64_t, max_sessions_per_peer, kDefaults.store.max_sessions_per_peer,
          "Most sessions of one TCP peer address or one Unix-socket uid (under --max_sessions).");
ABSL_FLAG(int, max_watchers_per_peer, kDefaults.max_watchers_per_peer,
          "Most WatchEvents streams one TCP peer address or one Unix-socket uid (all its "
          "connections together) may hold (all peers together: 64).");
ABSL_FLAG(uint64_t, watcher_max_backlog, kDefaults.watcher_max_backlog,
          "A WatchEvents stream is dropped (RESOURCE_EXHAUSTED naming the from_seq to resume "
          "from) once more than this many events were recorded while one of its writes "
          "waited for the client to read.");
ABSL_FLAG(int, max_fd_connections, kDefaults.max_fd_connections,
          "Most open connections to the fd socket.");
ABSL_FLAG(absl::Duration, fd_idle_timeout, kDefaults.fd_idle_timeout,
          "An fd-socket connection idle this long is closed (clients reconnect).");
ABSL_FLAG(absl::Duration, fd_request_timeout, kDefaults.fd_request_timeout,
          "One fd-socket request must arrive whole and its reply be taken within this long of "
          "its first byte, however the peer paces it (else the connection is closed).");
ABSL_FLAG(int, test_prefix_hash_bits, kDefaults.store.TEST_prefix_hash_bits,
          "Tests only: keep this many bits (0-128) of each prefix page hash, so that hashes "
          "collide and the token-id check must catch them. Leave at 128.");
ABSL_FLAG(bool, mutex_deadlock_detection, false,
          "abseil's lock-order (deadlock) checking on every mutex of the process, gRPC's "
          "included: hundreds of instructions per lock where abseil is a debug build (as "
          "Debian's is), about a third of an empty RPC. For debugging; off by default.");

ABSL_FLAG(kvarena::ByteSize, tier_host_bytes, kvarena::ByteSize{kDefaults.tiers.host_bytes},
          "Host memory for the host tier below the arena: chunks of prefixes the arena evicted "
          "(docs/tiers.md); 0 = no host tier.");
ABSL_FLAG(std::string, tier_disk_dir, kDefaults.tiers.disk_dir,
          "Directory of the disk tier: chunk files that outlive a restart; \"\" = no disk tier.");
ABSL_FLAG(kvarena::ByteSize, tier_disk_bytes, kvarena::ByteSize{kDefaults.tiers.disk_bytes},
          "Bytes of chunk files the disk tier may keep in --tier_disk_dir (required with it).");
ABSL_FLAG(int, tier_chunk_pages, kDefaults.tiers.chunk_pages,
          "Pages of a prefix (every layer, K and V) per tier chunk; 0 = the fewest that make "
          "256 KiB.");
ABSL_FLAG(bool, tier_write_through, kDefaults.tiers.write_through,
          "Copy each chunk to the tiers once it is full and registered, not only when the arena "
          "evicts it.");
ABSL_FLAG(absl::Duration, tier_timeout, kDefaults.tiers.timeout,
          "How long one Allocate may spend reading the tiers; the rest of its prefix is a miss.");
ABSL_FLAG(std::string, tier_redis, kDefaults.tiers.redis,
          "Seed nodes HOST:PORT[,HOST:PORT...] of a Redis Cluster (or one plain Redis) shared by "
          "every node: the lowest tier, write-through (docs/redis-tier.md); \"\" = none.");
ABSL_FLAG(std::string, tier_redis_user, kDefaults.tiers.redis_user,
          "ACL user of --tier_redis (\"\": AUTH with the password alone).");
ABSL_FLAG(
    std::string, tier_redis_password_file, kDefaults.tiers.redis_password_file,
    "File holding the password of --tier_redis (trailing whitespace dropped); \"\" = no AUTH.");
ABSL_FLAG(std::string, tier_redis_key_prefix, kDefaults.tiers.redis_key_prefix,
          "Prefix of every key the cluster tier writes.");
ABSL_FLAG(absl::Duration, tier_redis_ttl, kDefaults.tiers.redis_ttl,
          "Expiry of a chunk in Redis, renewed when read; 0 = none (let maxmemory-policy evict).");
ABSL_FLAG(kvarena::ByteSize, tier_write_queue_bytes,
          kvarena::ByteSize{kDefaults.tiers.write_queue_bytes},
          "Chunks waiting to be written to the tiers; past it a write is dropped (counted).");

namespace kvarena {

void ConfigureFlagsUsage() {
  absl::SetProgramUsageMessage(
      "the kvarena KV-cache daemon (gRPC service kvarena.v1.KvCacheService, "
      "grpc.health.v1.Health, server reflection).\nUsage: kvarenad [--listen=unix:PATH,"
      "HOST:PORT] [--arena_bytes=1Gi] [flags]");
  absl::FlagsUsageConfig config;
  // --version: CMake's project VERSION, the one the wheel (setup.py) and find_package see.
  config.version_string = [] { return std::string("kvarenad " KVARENA_VERSION "\n"); };
  const auto ours = [](absl::string_view file) { return absl::StrContains(file, "daemon/"); };
  config.contains_help_flags = ours;
  config.contains_helpshort_flags = ours;
  config.normalize_filename = [](absl::string_view file) {
    const size_t at = file.rfind("daemon/");
    return std::string(at == absl::string_view::npos ? file : file.substr(at));
  };
  absl::SetFlagsUsageConfig(config);
}

void ApplyProcessFlags() {
  absl::SetMutexDeadlockDetectionMode(absl::GetFlag(FLAGS_mutex_deadlock_detection)
                                          ? absl::OnDeadlockCycle::kAbort
                                          : absl::OnDeadlockCycle::kIgnore);
}

DaemonOptions OptionsFromFlags() {
  DaemonOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.backend = absl::GetFlag(FLAGS_backend);
  o.store.arena_bytes = absl::GetFlag(FLAGS_arena_bytes).bytes;
  o.store.arena_warm_bytes = absl::GetFlag(FLAGS_arena_warm_bytes).bytes;
  o.store.arena_prefault = absl::GetFlag(FLAGS_arena_prefault);
  o.store.default_page_size = absl::GetFlag(FLAGS_page_size);
  o.session_grace = absl::GetFlag(FLAGS_session_grace);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  o.store.num_threads = absl::GetFlag(FLAGS_num_threads);
  o.store.cpu_pool_awake = absl::GetFlag(FLAGS_cpu_pool_awake);
  o.fd_socket = absl::GetFlag(FLAGS_fd_socket);
  o.socket_mode = absl::GetFlag(FLAGS_socket_mode).bits;
  o.socket_group = absl::GetFlag(FLAGS_socket_group);
  o.allowed_uids = absl::GetFlag(FLAGS_allowed_uids).uids;
  o.tcp.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tcp.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tcp.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  o.tcp.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  o.tenants_file = absl::GetFlag(FLAGS_tenants_file);
  o.store.max_reply_bytes = absl::GetFlag(FLAGS_max_message_bytes).bytes;
  o.store.scratch_bytes = absl::GetFlag(FLAGS_scratch_bytes).bytes;
  o.store.metadata_bytes = absl::GetFlag(FLAGS_metadata_bytes).bytes;
  o.store.prefix_event_bytes = absl::GetFlag(FLAGS_event_log_bytes).bytes;
  o.store.session_metadata_bytes = absl::GetFlag(FLAGS_session_metadata_bytes).bytes;
  o.store.cached_metadata_bytes = absl::GetFlag(FLAGS_cached_metadata_bytes).bytes;
  o.store.max_pools = absl::GetFlag(FLAGS_max_pools);
  o.store.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  o.store.max_caches = absl::GetFlag(FLAGS_max_caches);
  o.store.max_caches_per_session = absl::GetFlag(FLAGS_max_caches_per_session);
  o.store.session_max_pages = absl::GetFlag(FLAGS_session_max_pages);
  o.store.max_request_tokens = absl::GetFlag(FLAGS_max_request_tokens);
  o.store.max_attend_work = absl::GetFlag(FLAGS_max_attend_work);
  o.store.idle_ttl = absl::GetFlag(FLAGS_idle_ttl);
  o.max_attach_per_peer = absl::GetFlag(FLAGS_max_attach_per_peer);
  o.max_watchers_per_peer = absl::GetFlag(FLAGS_max_watchers_per_peer);
  o.store.max_sessions_per_peer = absl::GetFlag(FLAGS_max_sessions_per_peer);
  o.max_fd_connections = absl::GetFlag(FLAGS_max_fd_connections);
  o.max_queued_bytes = absl::GetFlag(FLAGS_max_queued_bytes).bytes;
  o.fd_idle_timeout = absl::GetFlag(FLAGS_fd_idle_timeout);
  o.fd_request_timeout = absl::GetFlag(FLAGS_fd_request_timeout);
  o.watcher_max_backlog = absl::GetFlag(FLAGS_watcher_max_backlog);
  o.store.TEST_prefix_hash_bits = absl::GetFlag(FLAGS_test_prefix_hash_bits);
  o.tiers.host_bytes = absl::GetFlag(FLAGS_tier_host_bytes).bytes;
  o.tiers.disk_dir = absl::GetFlag(FLAGS_tier_disk_dir);
  o.tiers.disk_bytes = absl::GetFlag(FLAGS_tier_disk_bytes).bytes;
  o.tiers.chunk_pages = absl::GetFlag(FLAGS_tier_chunk_pages);
  o.tiers.write_through = absl::GetFlag(FLAGS_tier_write_through);
  o.tiers.timeout = absl::GetFlag(FLAGS_tier_timeout);
  o.tiers.write_queue_bytes = absl::GetFlag(FLAGS_tier_write_queue_bytes).bytes;
  o.tiers.redis = absl::GetFlag(FLAGS_tier_redis);
  o.tiers.redis_user = absl::GetFlag(FLAGS_tier_redis_user);
  o.tiers.redis_password_file = absl::GetFlag(FLAGS_tier_redis_password_file);
  o.tiers.redis_key_prefix = absl::GetFlag(FLAGS_tier_redis_key_prefix);
  o.tiers.redis_ttl = absl::GetFlag(FLAGS_tier_redis_ttl);
  return o;
}

}  // namespace kvarena
