// Who may reach kvarenad's Unix sockets (every unix: gRPC listener and the fd socket):
// the mode and group a socket file gets (--socket_mode, --socket_group), and the fd
// socket's rule for the uid of a peer (SO_PEERCRED, --allowed_uids). gRPC Unix sockets
// are guarded by the file alone; the fd socket, which hands out memory, checks both.
//
// Plain functions and value types, thread-compatible; OwnerOnlyUmask is process-wide
// (see there).
#ifndef KVARENA_DAEMON_SOCKET_ACCESS_H_
#define KVARENA_DAEMON_SOCKET_ACCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvarena {

// --socket_mode: permission bits in octal ("0660", "660"). Only bits within 0777 that
// include owner read and write (0600): without them kvarenad's own user could not connect,
// nor probe a stale socket file at its next start.
struct SocketMode {
  mode_t bits = 0660;
};
bool AbslParseFlag(absl::string_view text, SocketMode* out, std::string* error);
std::string AbslUnparseFlag(SocketMode mode);  // "0660"
// INVALID_ARGUMENT naming --socket_mode unless `bits` is a mode the flag would parse to.
absl::Status CheckSocketMode(mode_t bits);

// --allowed_uids: comma-separated numeric uids ("1000,1001"); "" = none listed.
struct UidList {
  std::vector<uid_t> uids;
};
bool AbslParseFlag(absl::string_view text, UidList* out, std::string* error);
std::string AbslUnparseFlag(const UidList& list);

// What a socket file gets right after bind.
struct SocketAccess {
  mode_t mode = 0660;
  std::optional<gid_t> group;  // nullopt: the group the file was created with
};

// --socket_group: a numeric gid, or a group name looked up in the group database.
// NOT_FOUND naming the flag when no group has that name.
absl::StatusOr<gid_t> LookupGroup(const std::string& name_or_gid);

// Gives path its group (when access.group is set), then its mode, in that order, so a
// socket bound under OwnerOnlyUmask is never open to more than `access` says. Errors name
// the path and the flag (a user that is not root may give a file only a group it is in).
absl::Status ApplySocketAccess(const std::string& path, const SocketAccess& access);

// While alive, the process umask is 0177, so a socket bound meanwhile is born 0600
// (owner only) until ApplySocketAccess opens it to its group. The umask is process-wide:
// hold one only at start-up, where no other thread creates files.
class OwnerOnlyUmask {
 public:
  OwnerOnlyUmask();
  ~OwnerOnlyUmask();
  OwnerOnlyUmask(const OwnerOnlyUmask&) = delete;
  OwnerOnlyUmask& operator=(const OwnerOnlyUmask&) = delete;

 private:
  const mode_t saved_;
};

// The fd socket's rule for a peer of uid `peer` in a daemon running as uid `self`. With no
// allowed_uids: self or root. With allowed_uids: exactly those uids plus self (root only
// when listed, or when the daemon runs as root). PERMISSION_DENIED naming the uid else.
absl::Status CheckFdPeer(uid_t peer, uid_t self, const std::vector<uid_t>& allowed_uids);

}  // namespace kvarena

#endif  // KVARENA_DAEMON_SOCKET_ACCESS_H_
