// kvarena_fd_peer: a process that drops to another uid and gid, then knocks on one of
// kvarenad's Unix sockets, for tests of their access rules (tests/access).
//
//   kvarena_fd_peer UID GID connect PATH
//       connect(2) to PATH; prints "connect: ok" or "connect: <strerror> (errno N)"
//   kvarena_fd_peer UID GID fds FD_SOCKET SESSION
//       ListRegions for SESSION, then ExportRegion of its first region; prints
//       "fds: code=C regions=R fds=F message=M" (the last reply's code and message)
//
// It drops every supplementary group, then sets GID and UID (run it as root). Exit 0 once
// it got as far as printing that line, 2 for bad usage, 3 when it cannot drop privileges.
#include <grp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "arena/fd_passing.h"
#include "kvarena/v1/kvarena.pb.h"

namespace kvarena {
namespace {

bool DropTo(uid_t uid, gid_t gid) {
  return setgroups(0, nullptr) == 0 && setgid(gid) == 0 && setuid(uid) == 0 && getuid() == uid &&
         geteuid() == uid && getgid() == gid;
}

int Connect(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  path.copy(addr.sun_path, sizeof(addr.sun_path) - 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
    std::printf("connect: ok\n");
  } else {
    std::printf("connect: %s (errno %d)\n", std::strerror(errno), errno);
  }
  if (fd >= 0) close(fd);
  return 0;
}

// One request and its reply; fds received are counted into *fds and closed.
bool Ask(int sock, const v1::FdRequest& req, v1::FdReply* reply, size_t* fds) {
  // A refused peer is answered and closed as it connects, so the send may fail with the
  // refusal already waiting: then read only what is there.
  const bool sent = SendMessage(sock, req.SerializeAsString()).ok();
  absl::StatusOr<Message> in =
      RecvMessage(sock, sent ? absl::InfiniteFuture() : absl::InfinitePast());
  if (!in.ok()) return false;
  *fds += in->fds.size();
  for (int fd : in->fds) close(fd);
  return reply->ParseFromString(in->bytes);
}

int Fds(const std::string& path, const std::string& session) {
  absl::StatusOr<int> sock = ConnectUnix(path);
  if (!sock.ok()) {
    std::printf("fds: cannot connect: %s\n", std::string(sock.status().message()).c_str());
    return 0;
  }
  v1::FdRequest list;
  list.set_session_id(session);
  list.mutable_list_regions();
  v1::FdReply reply;
  size_t fds = 0;
  int regions = 0;
  if (!Ask(*sock, list, &reply, &fds)) {
    std::printf("fds: no reply\n");
  } else {
    regions = reply.regions_size();
    if (reply.code() == 0 && regions > 0) {
      v1::FdRequest get;
      get.set_session_id(session);
      get.mutable_export_region()->set_region_id(reply.regions(0).region_id());
      if (!Ask(*sock, get, &reply, &fds)) reply.set_message("no reply to ExportRegion");
    }
    std::printf("fds: code=%d regions=%d fds=%zu message=%s\n", reply.code(), regions, fds,
                reply.message().c_str());
  }
  close(*sock);
  return 0;
}

}  // namespace
}  // namespace kvarena

int main(int argc, char** argv) {
  const std::string op = argc > 3 ? argv[3] : "";
  if (!((op == "connect" && argc == 5) || (op == "fds" && argc == 6))) {
    std::fprintf(stderr, "usage: kvarena_fd_peer UID GID connect PATH | fds FD_SOCKET SESSION\n");
    return 2;
  }
  if (!kvarena::DropTo(uid_t(std::atol(argv[1])), gid_t(std::atol(argv[2])))) {
    std::fprintf(stderr, "kvarena_fd_peer: cannot become %s:%s: %s\n", argv[1], argv[2],
                 std::strerror(errno));
    return 3;
  }
  return op == "connect" ? kvarena::Connect(argv[4]) : kvarena::Fds(argv[4], argv[5]);
}
