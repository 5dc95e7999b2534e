// Caller and TenantScope: how the daemon keeps tenants apart (--tenants_file) without core
// knowing of them. Core sees one flat store; each tenant's cache ids and prefix namespaces
// reach it as "<tenant>\x1f<id>" — a separator no valid id a tenant sends can forge into
// another tenant's (tenant names hold no \x1f, and the prefix is always added) — and come
// back with the prefix stripped. A tenant therefore finds only its own caches (another's
// is NOT_FOUND, as if it did not exist), shares prefix pages only with itself, and its
// ListCaches / WatchEvents show only its own. Sessions carry their tenant in core
// (KvStore::AttachSession's owner); Requests refuses another tenant's session as unknown.
//
// The operator role (Tenant::operator_role) sees every tenant's caches, named
// "<tenant>/<id>" both ways, and may call only the read-only RPCs (CheckWrite).
// Without --tenants_file (tenant null) every mapping is the identity.
//
// Thread-safety: one per call (it records the names it mapped in, for Out(status)).
#ifndef KVARENA_DAEMON_TENANT_SCOPE_H_
#define KVARENA_DAEMON_TENANT_SCOPE_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/types.h"
#include "daemon/tenants.h"

namespace kvarena {

inline constexpr char kTenantSeparator = '\x1f';

// Who a call comes from.
struct Caller {
  std::string session;             // metadata kvarena-session; "" for none
  const Tenant* tenant = nullptr;  // null without --tenants_file
  bool unix_socket = false;        // it came over a Unix socket
};

// Whether the caller may see every cache's prefix namespace and every event's namespace
// and token ids: with tenants, the tenant's own are all it sees (TenantScope filters the
// rest out); without, only the operator sees them — a caller with no session over a Unix
// socket (as the kvarena CLI is). Other callers see namespaces of their own session's
// caches only, and events without namespaces or token ids.
bool SeesAllNames(const Caller& caller);

class TenantScope {
 public:
  explicit TenantScope(const Tenant* tenant);

  bool tenanted() const { return tenant_ != nullptr; }
  // Whether the caller sees every tenant's names (the operator, or no tenants).
  bool sees_all() const { return prefix_.empty(); }
  // The tenant's name (core's session owner); "" without tenants.
  const std::string& owner() const;
  // PERMISSION_DENIED for the operator role, naming the rpc: it only reads.
  absl::Status CheckWrite(absl::string_view rpc) const;

  // A cache id as core knows it. The operator's "<tenant>/<id>" names that tenant's cache.
  // Recorded, so that Out(status) names it as the caller did.
  std::string CacheIn(absl::string_view id) const;
  // A prefix namespace as core knows it ("" stays "": it shares nothing).
  std::string NamespaceIn(absl::string_view ns) const;
  // Whether a core cache id or namespace is the caller's to see (sees_all: any).
  bool Sees(absl::string_view core_name) const;
  // A core cache id or namespace as the caller names it.
  std::string Out(absl::string_view core_name) const;
  // Info's cache id and namespace as the caller names them.
  void Out(CacheInfo* info) const;
  // A status whose message names core ids (core quotes them: base/checked.h Quoted), as
  // the caller names them.
  absl::Status Out(const absl::Status& status) const;

 private:
  const Tenant* const tenant_;
  const std::string prefix_;  // "<tenant>\x1f" for a tenant, "" for the operator or none
  // Quoted(core name) -> Quoted(the caller's), for each name mapped in.
  mutable std::vector<std::pair<std::string, std::string>> quoted_;
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_TENANT_SCOPE_H_
