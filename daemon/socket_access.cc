#include "daemon/socket_access.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace kvarena {
namespace {

constexpr mode_t kOwnerReadWrite = 0600;

bool AllDigits(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), absl::ascii_isdigit);
}

std::string Octal(mode_t bits) { return absl::StrFormat("%04o", bits); }

}  // namespace

absl::Status CheckSocketMode(mode_t bits) {
  if (bits > 0777 || (bits & kOwnerReadWrite) != kOwnerReadWrite) {
    return absl::InvalidArgumentError(
        absl::StrCat("--socket_mode=", Octal(bits),
                     " must lie within 0777 and include 0600 (owner read "
                     "and write), e.g. 0660"));
  }
  return absl::OkStatus();
}

bool AbslParseFlag(absl::string_view text, SocketMode* out, std::string* error) {
  const absl::string_view s = absl::StripAsciiWhitespace(text);
  uint32_t bits = 0;
  const auto octal_digit = [](char c) { return c >= '0' && c <= '7'; };
  if (s.empty() || s.size() > 4 || !std::all_of(s.begin(), s.end(), octal_digit)) {
    *error = absl::StrCat("'", text, "' is not an octal mode such as 0660");
    return false;
  }
  for (char c : s) bits = bits * 8 + uint32_t(c - '0');
  if (absl::Status st = CheckSocketMode(mode_t(bits)); !st.ok()) {
    *error = std::string(st.message());
    return false;
  }
  out->bits = mode_t(bits);
  return true;
}

std::string AbslUnparseFlag(SocketMode mode) { return Octal(mode.bits); }

bool AbslParseFlag(absl::string_view text, UidList* out, std::string* error) {
  UidList list;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    uint32_t uid = 0;
    // (uid_t)-1 means "no uid" to chown and setreuid; no peer has it.
    if (!AllDigits(part) || !absl::SimpleAtoi(part, &uid) || uid == UINT32_MAX) {
      *error = absl::StrCat("'", part, "' in '", text, "' is not a numeric uid below 4294967295");
      return false;
    }
    list.uids.push_back(uid_t(uid));
  }
  *out = std::move(list);
  return true;
}

std::string AbslUnparseFlag(const UidList& list) { return absl::StrJoin(list.uids, ","); }

absl::StatusOr<gid_t> LookupGroup(const std::string& name_or_gid) {
  uint32_t gid = 0;
  if (AllDigits(name_or_gid)) {
    if (!absl::SimpleAtoi(name_or_gid, &gid) || gid == UINT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("--socket_group=", name_or_gid, " is not a gid below 4294967295"));
    }
    return gid_t(gid);
  }
  std::vector<char> buf(16 << 10);
  group g{};
  group* found = nullptr;
  int err = 0;
  while ((err = getgrnam_r(name_or_gid.c_str(), &g, buf.data(), buf.size(), &found)) == ERANGE &&
         buf.size() < (1u << 24)) {
    buf.resize(buf.size() * 2);
  }
  if (err != 0) {
    return absl::Status(
        absl::ErrnoToStatusCode(err),
        absl::StrCat("--socket_group=", name_or_gid, ": cannot look it up: ", std::strerror(err)));
  }
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat("--socket_group=", name_or_gid, ": no such group"));
  }
  return g.gr_gid;
}

absl::Status ApplySocketAccess(const std::string& path, const SocketAccess& access) {
  if (access.group.has_value() && chown(path.c_str(), uid_t(-1), *access.group) != 0) {
    const int err = errno;
    return absl::Status(
        absl::ErrnoToStatusCode(err),
        absl::StrCat("cannot give ", path, " group ", *access.group,
                     " (--socket_group): ", std::strerror(err),
                     err == EPERM ? " (kvarenad's user must be in that group)" : ""));
  }
  if (chmod(path.c_str(), access.mode) != 0) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat("cannot chmod ", path, " to ", Octal(access.mode),
                                     " (--socket_mode): ", std::strerror(err)));
  }
  return absl::OkStatus();
}

OwnerOnlyUmask::OwnerOnlyUmask() : saved_(umask(0177)) {}
OwnerOnlyUmask::~OwnerOnlyUmask() { umask(saved_); }

absl::Status CheckFdPeer(uid_t peer, uid_t self, const std::vector<uid_t>& allowed_uids) {
  if (peer == self) return absl::OkStatus();
  if (allowed_uids.empty()) {
    if (peer == 0) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat("fd socket: peer uid ", peer, " is neither kvarenad's uid ", self,
                     " nor root (--allowed_uids names further uids)"));
  }
  if (std::find(allowed_uids.begin(), allowed_uids.end(), peer) != allowed_uids.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("fd socket: peer uid ", peer, " is neither kvarenad's uid ", self,
                   " nor in --allowed_uids=", absl::StrJoin(allowed_uids, ",")));
}

}  // namespace kvarena
