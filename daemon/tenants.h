// Tenants: who may call kvarenad when --tenants_file is set. Each line of the file names a
// tenant, the file holding its bearer token, and optionally its role and session bound:
//
//   # comment
//   alice /etc/kvarena/alice.token
//   ops   /etc/kvarena/ops.token   role=operator
//
//   bob   /etc/kvarena/bob.token     max_sessions=8
//
//   carol /etc/kvarena/carol.token   max_caches=100 max_pages=4096 max_metadata_bytes=16Mi
//
// max_sessions=N bounds the sessions the tenant holds at once (attached or in their grace
// period); max_caches=N the caches it holds (its sessions' and its sessionless ones);
// max_pages=N the arena pages its caches hold, a page counted once per cache holding it
// (prefix pages it adopted and pages shared by Fork included); max_metadata_bytes=BYTES
// (a count, or with a unit as --metadata_bytes takes) the metadata its caches hold —
// without it, an equal share of --metadata_bytes among the tenants that are not operators.
// Each is RESOURCE_EXHAUSTED naming the tenant and the bound beyond it (counted in core:
// KvStore's owners), on top of the daemon-wide flags.
//
// A tenant's name is 1-64 bytes of [A-Za-z0-9_.-]; a relative token path is read from
// the tenants file's directory. role=operator is a read-only view of every tenant
// (docs/trust.md). Every KvCacheService call must then carry `authorization: Bearer
// <token>` of one of them (Authenticate), on every listener, Unix and TCP.
//
// Thread-safety: immutable after Load/Parse.
#ifndef KVARENA_DAEMON_TENANTS_H_
#define KVARENA_DAEMON_TENANTS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvarena {

struct Tenant {
  std::string name;
  std::string token;  // the bearer token itself
  bool operator_role = false;
  int64_t max_sessions = 0;         // 0: only the daemon's --max_sessions
  int64_t max_caches = 0;           // 0: only --max_caches (and --max_caches_per_session)
  int64_t max_pages = 0;            // 0: only the arena (and --session_max_pages)
  uint64_t max_metadata_bytes = 0;  // 0: an equal share of --metadata_bytes
};

class Tenants {
 public:
  // Reads a tenant's token file: the path as written on the line (relative paths
  // resolved by Load), and how to name it in a message.
  using TokenReader =
      std::function<absl::StatusOr<std::string>(absl::string_view what, const std::string& path)>;

  // Reads --tenants_file. INVALID_ARGUMENT naming the file and line for a malformed line,
  // a bad name, an unknown option, a duplicate name or token, a too-short token file (an
  // unreadable one: the read's code); or for a file with no tenant.
  static absl::StatusOr<Tenants> Load(const std::string& path);
  // As Load, for the file's text (file names it in messages).
  static absl::StatusOr<Tenants> Parse(absl::string_view file, absl::string_view text,
                                       const TokenReader& read_token);

  // The tenant whose token `authorization` ("Bearer <token>") carries, comparing with
  // every tenant's token in constant time; UNAUTHENTICATED when absent or unknown.
  absl::StatusOr<const Tenant*> Authenticate(std::optional<absl::string_view> authorization) const;

  const std::vector<Tenant>& all() const { return tenants_; }

 private:
  std::vector<Tenant> tenants_;  // never resized after Parse: Authenticate's pointers stay valid
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_TENANTS_H_
