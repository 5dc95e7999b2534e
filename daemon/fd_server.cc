#include "daemon/fd_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "arena/fd_passing.h"
#include "kvarena/v1/kvarena.pb.h"
#include "proto/wire.h"

namespace kvarena {
namespace {

v1::FdReply Error(const absl::Status& s) {
  v1::FdReply r;
  r.set_code(int(s.code()));
  r.set_message(std::string(s.message()));
  return r;
}

bool PeerAllowed(int conn) {
  absl::StatusOr<PeerCred> c = PeerCredentials(conn);
  return c.ok() && (c->uid == geteuid() || c->uid == 0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<FdServer>> FdServer::Start(const std::string& path, KvStore* store) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("fd socket path '", path, "' is too long"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  // A socket file nobody answers on is stale (a daemon that died); a live one is not ours.
  if (absl::StatusOr<int> live = ConnectUnix(path); live.ok()) {
    close(*live);
    return absl::FailedPreconditionError(absl::StrCat("fd socket ", path, " is in use by a live daemon"));
  }
  unlink(path.c_str());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 64) != 0 ||
      chmod(path.c_str(), 0660) != 0) {
    absl::Status s = absl::InternalError(absl::StrCat("fd socket ", path, ": ", std::strerror(errno)));
    close(fd);
    return s;
  }
  std::unique_ptr<FdServer> server(new FdServer(path, fd, store));
  if (pipe2(server->stop_pipe_, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

FdServer::FdServer(std::string path, int listen_fd, KvStore* store)
    : path_(std::move(path)), listen_fd_(listen_fd), store_(store) {}

FdServer::~FdServer() {
  if (stop_pipe_[1] >= 0) {
    const char b = 0;
    (void)!write(stop_pipe_[1], &b, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (int c : conns_) shutdown(c, SHUT_RDWR);  // wakes a worker blocked in recv
    idle_.wait(lock, [this] { return conns_.empty(); });
  }
  close(listen_fd_);
  for (int p : stop_pipe_) {
    if (p >= 0) close(p);
  }
  unlink(path_.c_str());
}

void FdServer::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    conns_.push_back(conn);
    std::thread([this, conn] { Serve(conn); }).detach();
  }
}

void FdServer::Serve(int conn) {
  const bool allowed = PeerAllowed(conn);
  for (;;) {
    absl::StatusOr<Message> in = RecvMessage(conn);
    if (!in.ok()) break;
    for (int fd : in->fds) close(fd);  // clients send none
    v1::FdRequest req;
    v1::FdReply reply;
    std::vector<SharedPiece> pieces;
    if (!allowed) {
      reply = Error(absl::PermissionDeniedError("fd socket: peer runs as another user"));
    } else if (!req.ParseFromString(in->bytes)) {
      reply = Error(absl::InvalidArgumentError("fd socket: request does not parse as FdRequest"));
    } else if (req.has_list_regions()) {
      absl::StatusOr<std::vector<RegionInfo>> regions = store_->SessionRegions(req.session_id());
      if (!regions.ok()) reply = Error(regions.status());
      for (const RegionInfo& r : regions.ok() ? *regions : std::vector<RegionInfo>{}) {
        ToProto(r, reply.add_regions());
      }
    } else if (req.has_export_region()) {
      absl::StatusOr<std::vector<SharedPiece>> all =
          store_->ExportRegion(req.session_id(), req.export_region().region_id(),
                               req.export_region().after_generation());
      if (!all.ok()) {
        reply = Error(all.status());
      } else {
        std::stable_sort(all->begin(), all->end(), [](const SharedPiece& a, const SharedPiece& b) {
          return a.generation < b.generation;
        });
        const size_t first = std::min<size_t>(req.export_region().first_piece(), all->size());
        const size_t end = std::min(all->size(), first + kMaxFdsPerMessage);
        reply.set_total_pieces(uint32_t(all->size()));
        for (size_t i = 0; i < all->size(); ++i) {
          if (i < first || i >= end) {
            close((*all)[i].fd);
            continue;
          }
          v1::RegionPiece* p = reply.add_pieces();
          p->set_offset((*all)[i].offset);
          p->set_bytes((*all)[i].bytes);
          p->set_generation((*all)[i].generation);
          pieces.push_back((*all)[i]);
        }
      }
    } else {
      reply = Error(absl::InvalidArgumentError("fd socket: request names no operation"));
    }
    std::vector<int> fds;
    for (const SharedPiece& p : pieces) fds.push_back(p.fd);
    const absl::Status sent = SendMessage(conn, reply.SerializeAsString(), fds);
    for (int fd : fds) close(fd);
    if (!sent.ok() || !allowed) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  close(conn);
  std::erase(conns_, conn);
  if (conns_.empty()) idle_.notify_all();
}

}  // namespace kvarena
