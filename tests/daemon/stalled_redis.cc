#include "tests/daemon/stalled_redis.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"

namespace kvarena {
namespace {

// Parses one RESP command (an array of bulk strings) off the front of *buf: its words, or
// nullopt while it is incomplete.
std::optional<std::vector<std::string>> TakeCommand(std::string* buf) {
  size_t at = 0;
  auto line = [&]() -> std::optional<int64_t> {
    const size_t end = buf->find("\r\n", at);
    if (end == std::string::npos || end == at) return std::nullopt;
    int64_t n = 0;
    if (!absl::SimpleAtoi(absl::string_view(*buf).substr(at + 1, end - at - 1), &n)) n = -1;
    at = end + 2;
    return n;
  };
  if (buf->empty() || (*buf)[0] != '*') return std::nullopt;
  const std::optional<int64_t> words = line();
  if (!words.has_value() || *words < 0) return std::nullopt;
  std::vector<std::string> out;
  for (int64_t i = 0; i < *words; ++i) {
    if (at >= buf->size() || (*buf)[at] != '$') return std::nullopt;
    const std::optional<int64_t> len = line();
    if (!len.has_value() || *len < 0 || buf->size() - at < size_t(*len) + 2) return std::nullopt;
    out.push_back(buf->substr(at, size_t(*len)));
    at += size_t(*len) + 2;
  }
  buf->erase(0, at);
  return out;
}

bool SendAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes.remove_prefix(size_t(n));
  }
  return true;
}

}  // namespace

StalledRedis::StalledRedis() {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(listen_fd_, 64) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return;
  }
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { Accept(); });
}

StalledRedis::~StalledRedis() { Stop(); }

bool StalledRedis::WaitStalled(absl::Duration timeout) {
  return stalled_.WaitForNotificationWithTimeout(timeout);
}

void StalledRedis::Stop() {
  stop_.store(true);
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> connections;
  {
    absl::MutexLock lock(&mu_);
    connections.swap(connections_);
  }
  for (std::thread& t : connections) t.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

void StalledRedis::Accept() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    absl::MutexLock lock(&mu_);
    connections_.emplace_back([this, fd] { Serve(fd); });
  }
}

void StalledRedis::Serve(int fd) {
  std::string buf;
  bool stalling = false;
  while (!stop_.load()) {
    if (stalling) {  // one byte of the reply that never ends, every 100 ms
      if (!SendAll(fd, "x")) break;
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    char chunk[4096];
    const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) break;
    buf.append(chunk, size_t(n));
    while (std::optional<std::vector<std::string>> cmd = TakeCommand(&buf)) {
      if (cmd->size() == 2 && absl::AsciiStrToUpper((*cmd)[0]) == "CLUSTER" &&
          absl::AsciiStrToUpper((*cmd)[1]) == "SLOTS") {
        if (!SendAll(fd, "-ERR This instance has cluster support disabled\r\n")) break;
        continue;
      }
      stalling = SendAll(fd, "+");
      if (!notified_.exchange(true)) stalled_.Notify();
      break;
    }
  }
  close(fd);
}

}  // namespace kvarena
