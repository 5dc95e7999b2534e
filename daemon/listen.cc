#include "daemon/listen.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace kvarena {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path, int err) {
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrCat(what, " ", path, ": ", std::strerror(err)));
}

// 0: something accepted the connection; else the errno of connect().
int TryConnect(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = rc == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

}  // namespace

absl::StatusOr<int> ListenUnix(const std::string& path, const SocketAccess& access) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' is too long"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket for", path, errno);
  int bound = 0;
  {
    OwnerOnlyUmask owner_only;  // born 0600, then opened to `access`
    bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  if (bound != 0 || ::listen(fd, SOMAXCONN) != 0) {
    absl::Status s = Errno(bound != 0 ? "bind" : "listen", path, errno);
    ::close(fd);
    return s;
  }
  if (absl::Status s = ApplySocketAccess(path, access); !s.ok()) {
    ::close(fd);
    ::unlink(path.c_str());
    return s;
  }
  return fd;
}

absl::StatusOr<std::vector<ListenAddress>> ParseListenAddresses(
    const std::vector<std::string>& specs) {
  std::vector<ListenAddress> out;
  for (const std::string& spec : specs) {
    absl::string_view rest = spec;
    if (absl::ConsumePrefix(&rest, "unix:")) {
      absl::ConsumePrefix(&rest, "//");  // unix:///abs/path
      if (rest.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("--listen: '", spec, "' has no path"));
      }
      if (rest.size() >= sizeof(sockaddr_un::sun_path)) {
        return absl::InvalidArgumentError(absl::StrCat("--listen: socket path '", rest, "' is ",
                                                       rest.size(), " bytes; the limit is ",
                                                       sizeof(sockaddr_un::sun_path) - 1));
      }
      out.push_back({spec, std::string(rest)});
    } else if (!spec.empty()) {
      out.push_back({spec, ""});
    }
  }
  if (out.empty()) {
    return absl::InvalidArgumentError("--listen: give at least one unix:PATH or HOST:PORT");
  }
  return out;
}

absl::Status PrepareUnixSocket(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return Errno("cannot create the directory of", path, ec.value());

  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? absl::OkStatus() : Errno("cannot stat", path, errno);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
  }
  const int err = TryConnect(path);
  if (err == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("another process (a running kvarenad?) is serving on unix:", path,
                     "; stop it or choose another --listen path"));
  }
  if (err != ECONNREFUSED) return Errno("cannot probe", path, err);
  if (::unlink(path.c_str()) != 0) return Errno("cannot remove stale socket", path, errno);
  return absl::OkStatus();
}

}  // namespace kvarena
