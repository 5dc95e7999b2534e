#include "tests/mp/stream_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"

namespace kvarena::testing {
namespace {

// A socket address for "unix:PATH" or "127.0.0.1:PORT".
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t size = 0;
  int family = AF_UNIX;
};

absl::StatusOr<SocketAddress> Parse(absl::string_view address) {
  SocketAddress a;
  if (absl::ConsumePrefix(&address, "unix:")) {
    auto* un = reinterpret_cast<sockaddr_un*>(&a.storage);
    if (address.size() >= sizeof(un->sun_path)) return absl::InvalidArgumentError("path too long");
    un->sun_family = AF_UNIX;
    std::memcpy(un->sun_path, address.data(), address.size());
    a.size = sizeof(sockaddr_un);
    return a;
  }
  uint32_t port = 0;
  if (!absl::ConsumePrefix(&address, "127.0.0.1:") || !absl::SimpleAtoi(address, &port) ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("want unix:PATH or 127.0.0.1:PORT, got ", address));
  }
  auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
  in->sin_family = AF_INET;
  in->sin_port = htons(uint16_t(port));
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.size = sizeof(sockaddr_in);
  a.family = AF_INET;
  return a;
}

int ConnectTo(const std::string& target) {
  absl::StatusOr<SocketAddress> a = Parse(target);
  if (!a.ok()) return -1;
  const int fd = socket(a->family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&a->storage), a->size) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Writes all of data; false when the peer is gone.
bool WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= size_t(w);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StreamProxy>> StreamProxy::Start(const std::string& listen,
                                                                const std::string& target) {
  KVARENA_ASSIGN_OR_RETURN(SocketAddress a, Parse(listen));
  const int fd = socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::Status(absl::ErrnoToStatusCode(errno), "socket");
  if (bind(fd, reinterpret_cast<const sockaddr*>(&a.storage), a.size) != 0 ||
      ::listen(fd, 64) != 0) {
    const int e = errno;
    close(fd);
    return absl::Status(absl::ErrnoToStatusCode(e), absl::StrCat("bind/listen ", listen));
  }
  std::string address = listen;
  if (a.family == AF_INET) {
    sockaddr_in bound{};
    socklen_t len = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    address = absl::StrCat("127.0.0.1:", ntohs(bound.sin_port));
  }
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(fd);
    return absl::Status(absl::ErrnoToStatusCode(errno), "pipe2");
  }
  return std::unique_ptr<StreamProxy>(new StreamProxy(fd, address, target, wake[0], wake[1]));
}

StreamProxy::StreamProxy(int listen_fd, std::string address, std::string target, int wake_read,
                         int wake_write)
    : listen_fd_(listen_fd),
      address_(std::move(address)),
      target_(std::move(target)),
      wake_read_(wake_read),
      wake_write_(wake_write) {
  thread_ = std::thread([this] { Run(); });
}

StreamProxy::~StreamProxy() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  Wake();
  thread_.join();
  close(listen_fd_);
  close(wake_read_);
  close(wake_write_);
}

void StreamProxy::Wake() const {
  const char c = 0;
  (void)!write(wake_write_, &c, 1);
}

void StreamProxy::Cut() {
  absl::MutexLock lock(&mu_);
  const int want = ++cuts_requested_;
  Wake();
  auto done = [this, want]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cuts_done_ >= want || stopping_; };
  mu_.Await(absl::Condition(&done));
}

void StreamProxy::SetRefusing(bool refusing) {
  absl::MutexLock lock(&mu_);
  refusing_ = refusing;
}

int StreamProxy::forwarded() const {
  absl::MutexLock lock(&mu_);
  return forwarded_;
}

int StreamProxy::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

void StreamProxy::Run() {
  std::vector<std::pair<int, int>> pairs;  // (client side, daemon side)
  auto close_all = [&pairs] {
    for (auto [a, b] : pairs) {
      close(a);
      close(b);
    }
    pairs.clear();
  };
  char buf[64 << 10];
  while (true) {
    std::vector<pollfd> fds = {{wake_read_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (auto [a, b] : pairs) {
      fds.push_back({a, POLLIN, 0});
      fds.push_back({b, POLLIN, 0});
    }
    if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) break;
    {
      while (read(wake_read_, buf, sizeof(buf)) > 0) {
      }
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      if (cuts_done_ < cuts_requested_) {
        close_all();
        cuts_done_ = cuts_requested_;
        continue;  // the poll set named the closed fds
      }
    }
    if (fds[1].revents & POLLIN) {
      const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client >= 0) {
        bool refusing;
        {
          absl::MutexLock lock(&mu_);
          refusing = refusing_;
        }
        const int daemon = refusing ? -1 : ConnectTo(target_);
        if (daemon < 0) {
          close(client);
          absl::MutexLock lock(&mu_);
          ++refused_;
        } else {
          pairs.emplace_back(client, daemon);
          absl::MutexLock lock(&mu_);
          ++forwarded_;
        }
      }
    }
    // Forward what each side sent; a pair one side of which closed is closed whole.
    const size_t polled = (fds.size() - 2) / 2;
    std::vector<std::pair<int, int>> kept;
    for (size_t p = 0; p < polled; ++p) {
      const pollfd& fa = fds[2 + 2 * p];
      const pollfd& fb = fds[3 + 2 * p];
      bool open = true;
      for (auto [from, to, ev] : {std::tuple(pairs[p].first, pairs[p].second, fa.revents),
                                  std::tuple(pairs[p].second, pairs[p].first, fb.revents)}) {
        if (!open || ev == 0) continue;
        const ssize_t n = read(from, buf, sizeof(buf));
        open = n > 0 && WriteAll(to, buf, size_t(n));
      }
      if (open) {
        kept.push_back(pairs[p]);
      } else {
        close(pairs[p].first);
        close(pairs[p].second);
      }
    }
    // Pairs accepted in this round were not polled yet: keep them.
    for (size_t p = polled; p < pairs.size(); ++p) kept.push_back(pairs[p]);
    pairs = std::move(kept);
  }
  close_all();
  absl::MutexLock lock(&mu_);
  cuts_done_ = cuts_requested_;
}

}  // namespace kvarena::testing
