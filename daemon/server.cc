#include "daemon/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "core/refusal.h"
#include "daemon/backend.h"
#include "daemon/byte_size.h"
#include "daemon/socket_access.h"
#include "grpc/health/v1/health.pb.h"

namespace kvarena {
namespace {

// The daemon's incarnation: 64 bits from the system's CSPRNG, never 0 (the proto's
// "unset").
uint64_t NewIncarnation() {
  uint64_t v = 0;
  while (v == 0) {
    size_t got = 0;
    while (got < sizeof(v)) {
      const ssize_t r = getrandom(reinterpret_cast<char*>(&v) + got, sizeof(v) - got, 0);
      if (r > 0) got += size_t(r);
    }
  }
  return v;
}

constexpr absl::Duration kReapInterval = absl::Milliseconds(100);
// gRPC's threads: KvCacheService and Health run on its callback threads (long calls on the
// service's own pool, daemon/offload.h), reflection on its sync-server threads, which
// this bounds.
constexpr int kMaxThreads = 4096;

// --fd_socket resolved: "" = beside the first unix: address (none without one), "none" =
// off, anything else is the path.
std::string FdSocketPath(const std::string& flag, const std::vector<ListenAddress>& addresses) {
  if (flag == "none") return "";
  if (!flag.empty()) return flag;
  for (const ListenAddress& a : addresses) {
    if (!a.unix_path.empty()) return a.unix_path + ".fds";
  }
  return "";
}

// max_message_bytes bounds what one request or reply may pin in memory (a 1 GiB cache id
// included); prefill appends and GetKv pages above gRPC's 4 MiB default fit under it.
void ConfigureBuilder(int max_message_bytes, grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(max_message_bytes);
  builder->SetMaxSendMessageSize(max_message_bytes);
  // Two daemons must never share a TCP port silently.
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Notice a vanished TCP peer so its Attach stream ends and its session's grace starts.
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
  grpc::ResourceQuota quota("kvarenad");
  quota.SetMaxThreads(kMaxThreads);
  builder->SetResourceQuota(quota);
  // Sync pollers (for reflection, the one sync service) pick up new calls while others run.
  builder->SetSyncServerOption(grpc::ServerBuilder::MIN_POLLERS, 2);
  builder->SetSyncServerOption(grpc::ServerBuilder::MAX_POLLERS, 8);
}

// --socket_mode and --socket_group, checked and looked up.
absl::StatusOr<SocketAccess> UnixSocketAccess(const DaemonOptions& options) {
  KVARENA_RETURN_IF_ERROR(CheckSocketMode(options.socket_mode));
  SocketAccess access{options.socket_mode, std::nullopt};
  if (!options.socket_group.empty()) {
    KVARENA_ASSIGN_OR_RETURN(gid_t gid, LookupGroup(options.socket_group));
    access.group = gid;
  }
  return access;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  std::unique_ptr<Daemon> d(new Daemon(options));
  KVARENA_ASSIGN_OR_RETURN(std::vector<ListenAddress> addresses,
                           ParseListenAddresses(options.listen));
  d->addresses_ = std::move(addresses);
  if (options.store.max_reply_bytes < (size_t{1} << 16) ||
      options.store.max_reply_bytes > (size_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_bytes=", options.store.max_reply_bytes, " must be in [64Ki, 1Gi]"));
  }
  if (options.max_attach_per_peer < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_attach_per_peer=", options.max_attach_per_peer, " must be at least 1"));
  }
  if (options.store.max_sessions_per_peer < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_sessions_per_peer=", options.store.max_sessions_per_peer, " must be at least 1"));
  }
  if (options.fd_request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fd_request_timeout=", absl::FormatDuration(options.fd_request_timeout),
                     " must be positive"));
  }
  if (options.watcher_max_backlog < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--watcher_max_backlog=", options.watcher_max_backlog, " must be at least 1"));
  }
  if (options.max_watchers_per_peer < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_watchers_per_peer=", options.max_watchers_per_peer, " must be at least 1"));
  }
  if (options.metrics_port < 0 || options.metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_port=", options.metrics_port, " must be in [0, 65535]"));
  }
  if (options.metrics_port != 0 && options.metrics_address.empty()) {
    return absl::InvalidArgumentError(
        "--metrics_address is empty; give an IP address such as 127.0.0.1");
  }
  KVARENA_ASSIGN_OR_RETURN(SocketAccess access, UnixSocketAccess(options));
  const bool has_tcp = std::any_of(d->addresses_.begin(), d->addresses_.end(),
                                   [](const ListenAddress& a) { return a.unix_path.empty(); });
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> tcp_credentials =
      TcpServerCredentials(options.tcp, has_tcp);
  KVARENA_RETURN_IF_ERROR(tcp_credentials.status());
  if (has_tcp) d->tcp_security_ = absl::StrCat(" tcp=", TcpSecurityName(options.tcp));
  if (!options.tenants_file.empty()) {
    // One token check per call: the tenants' tokens replace the shared one, and cross the
    // network only under TLS.
    if (!options.tcp.auth_token_file.empty()) {
      return absl::InvalidArgumentError(
          "--tenants_file and --auth_token_file exclude each other: with tenants every call "
          "on every listener carries a tenant's token; drop --auth_token_file");
    }
    if (has_tcp && options.tcp.tls_cert.empty()) {
      return absl::InvalidArgumentError(
          "--tenants_file with a HOST:PORT listener needs --tls_cert and --tls_key: tenants' "
          "bearer tokens must not cross the network in plaintext");
    }
    KVARENA_ASSIGN_OR_RETURN(Tenants tenants, Tenants::Load(options.tenants_file));
    d->tenants_ = std::make_unique<Tenants>(std::move(tenants));
    absl::StrAppend(&d->tcp_security_, " tenants=", d->tenants_->all().size());
  }

  KVARENA_ASSIGN_OR_RETURN(ServingBackend backend, MakeServingBackend(options.backend));
  StoreOptions store_options = options.store;
  store_options.kernels = std::move(backend.kernels);
  if (d->tenants_ != nullptr) {
    // Every tenant gets its own quota (its sessionless caches apart from the others'),
    // bounded by its line's max_caches / max_pages / max_metadata_bytes.
    for (const Tenant& t : d->tenants_->all()) {
      if (!t.operator_role) {
        store_options.owners[t.name] =
            OwnerBounds{t.max_caches, t.max_pages, size_t(t.max_metadata_bytes)};
      }
    }
  }
  KVARENA_ASSIGN_OR_RETURN(DaemonTiers tiers, MakeTiers(options.tiers, &d->tier_latency_));
  store_options.tiers = tiers.set;
  d->redis_ = tiers.redis;
  // The store calls it only from served calls and the reaper, which start after attach_.
  Daemon* self = d.get();
  store_options.on_regions_changed = [self] { self->attach_->RegionsChanged(); };
  store_options.on_prefix_events = [self] {
    if (self->events_ != nullptr) self->events_->EventsRecorded();
  };
  absl::StatusOr<std::unique_ptr<KvStore>> store =
      KvStore::Create(store_options, std::move(backend.backend));
  KVARENA_RETURN_IF_ERROR(store.status());
  d->store_ = std::move(*store);
  const std::string fd_path = FdSocketPath(options.fd_socket, d->addresses_);
  const uint64_t incarnation = NewIncarnation();
  d->attach_ = std::make_unique<AttachHub>(
      d->store_.get(), &d->rpcs_,
      AttachHub::Options{options.session_grace, fd_path, options.max_attach_per_peer, incarnation,
                         &d->peer_uids_});
  EventsHub::Options events_options;
  events_options.incarnation = incarnation;
  events_options.max_watchers_per_peer = options.max_watchers_per_peer;
  events_options.max_backlog = options.watcher_max_backlog;
  events_options.peer_uids = &d->peer_uids_;
  d->events_ = std::make_unique<EventsHub>(d->store_.get(), &d->rpcs_, events_options);
  ServiceOptions service_options;
  service_options.tenants = d->tenants_.get();
  service_options.tiers = tiers.set != nullptr;
  service_options.max_queued_bytes = options.max_queued_bytes;
  d->service_ = std::make_unique<KvCacheServiceImpl>(d->store_.get(), &d->rpcs_, d->attach_.get(),
                                                     d->events_.get(), service_options);
  if (options.metrics_port != 0) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> metrics = MetricsServer::Start(
        options.metrics_address, options.metrics_port,
        MetricSources{d->store_.get(), &d->rpcs_, &d->fd_metrics_, &d->tier_latency_, d->redis_});
    KVARENA_RETURN_IF_ERROR(metrics.status());
    d->metrics_ = std::move(*metrics);
  }

  for (const ListenAddress& a : d->addresses_) {
    if (a.unix_path.empty()) continue;
    KVARENA_RETURN_IF_ERROR(PrepareUnixSocket(a.unix_path));
  }
  if (!fd_path.empty()) {
    FdServerOptions fd_options;
    fd_options.max_connections = options.max_fd_connections;
    fd_options.idle_timeout = options.fd_idle_timeout;
    fd_options.request_timeout = options.fd_request_timeout;
    fd_options.access = access;
    fd_options.allowed_uids = options.allowed_uids;
    fd_options.metrics = &d->fd_metrics_;
    absl::StatusOr<std::unique_ptr<FdServer>> fd_server =
        FdServer::Start(fd_path, d->store_.get(), std::move(fd_options));
    if (!fd_server.ok()) {
      return Annotated(fd_server.status(), "--fd_socket: ");
    }
    d->fd_server_ = *std::move(fd_server);
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // The default health service speaks upb internally; linking the generated message
  // registers grpc.health.v1 in the generated pool, so reflection can describe it.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();

  grpc::ServerBuilder builder;
  std::vector<int> ports(d->addresses_.size(), 0);
  for (size_t i = 0; i < d->addresses_.size(); ++i) {
    const ListenAddress& a = d->addresses_[i];
    if (a.unix_path.empty()) {
      builder.AddListeningPort(a.uri, *tcp_credentials, &ports[i]);
      continue;
    }
    // Accepted by kvarenad itself, which learns each peer's uid (daemon/unix_listener.h).
    absl::StatusOr<std::unique_ptr<UnixListener>> listener =
        UnixListener::Bind(a.unix_path, access, &d->peer_uids_);
    if (!listener.ok()) return Annotated(listener.status(), absl::StrCat("--listen=", a.uri, ": "));
    d->unix_listeners_.push_back(*std::move(listener));
  }
  builder.RegisterService(d->service_.get());
  ConfigureBuilder(int(options.store.max_reply_bytes), &builder);
  {
    OwnerOnlyUmask owner_only;  // Unix sockets are born 0600, then opened to `access`
    d->server_ = builder.BuildAndStart();
  }
  if (d->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", absl::StrJoin(options.listen, ","), " (the gRPC log above says why)"));
  }
  for (size_t i = 0; i < d->addresses_.size(); ++i) {
    ListenAddress& a = d->addresses_[i];
    if (a.unix_path.empty() && absl::EndsWith(a.uri, ":0")) {  // report the port the system picked
      a.uri = absl::StrCat(a.uri.substr(0, a.uri.size() - 1), ports[i]);
    }
  }
  for (const std::unique_ptr<UnixListener>& listener : d->unix_listeners_) {
    KVARENA_RETURN_IF_ERROR(listener->Start(d->server_.get()));
  }
  grpc::HealthCheckServiceInterface* health = d->server_->GetHealthCheckService();
  health->SetServingStatus("", true);
  health->SetServingStatus(v1::KvCacheService::service_full_name(), true);

  d->reaper_ = std::thread([self] {
    while (!self->stop_reaper_.WaitForNotificationWithTimeout(kReapInterval)) {
      self->store_->Reap();
    }
  });
  return d;
}

Daemon::~Daemon() {
  if (reaper_.joinable()) {
    stop_reaper_.Notify();
    reaper_.join();
  }
  unix_listeners_.clear();     // no connection reaches server_ any more
  if (server_ != nullptr) {    // both no-ops after Shutdown(deadline)
    attach_->BeginShutdown();  // else Shutdown() would wait for attached workers forever
    events_->BeginShutdown();  // ... and for watchers
    server_->Shutdown();
  }
}

void Daemon::Shutdown(absl::Duration deadline) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(false);  // Watch streams see NOT_SERVING ...
  health->Shutdown();               // ... and then end, so they do not hold up the drain
  unix_listeners_.clear();          // no new connection reaches server_
  attach_->BeginShutdown();
  events_->BeginShutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + deadline));
  fd_server_.reset();  // no session is attached any more
}

void Daemon::Wait() { server_->Wait(); }

std::string Daemon::StartLine() const {
  std::vector<std::string> uris;
  for (const ListenAddress& a : addresses_) uris.push_back(a.uri);
  return absl::StrCat("kvarenad: serving backend=", store_->Stats().backend,
                      " arena_bytes=", options_.store.arena_bytes, " (",
                      AbslUnparseFlag(ByteSize{options_.store.arena_bytes}),
                      ") page_size=", options_.store.default_page_size,
                      " session_grace=", absl::FormatDuration(options_.session_grace),
                      " metrics=", metrics_ != nullptr ? metrics_->bind_address() : "off", " on ",
                      absl::StrJoin(uris, ","), tcp_security_,
                      " fd_socket=", fd_server_ != nullptr ? fd_server_->path() : "none",
                      DescribeTiers(options_.tiers));
}

std::string Daemon::fd_socket() const { return fd_server_ != nullptr ? fd_server_->path() : ""; }

}  // namespace kvarena
