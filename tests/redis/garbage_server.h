// Test-only: GarbageServer, a scripted stand-in for a Redis node on loopback, for the
// tests of the Redis client that need no redis-server (replies it cannot parse, redirects,
// a node failing and recovering on demand).
//
// Thread-safety: set_reply may be called while the server thread answers.
#ifndef KVARENA_TESTS_REDIS_GARBAGE_SERVER_H_
#define KVARENA_TESTS_REDIS_GARBAGE_SERVER_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace kvarena::testing {

// A TCP server on loopback that answers every command with `reply`, except CLUSTER SLOTS,
// which it answers as a non-cluster Redis does, and ASKING (+OK).
class GarbageServer {
 public:
  explicit GarbageServer(std::string reply) : reply_(std::move(reply)) { Listen(); }
  ~GarbageServer() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  int port() const { return port_; }
  void set_reply(std::string reply) {
    absl::MutexLock lock(&mu_);
    reply_ = std::move(reply);
  }

 private:
  void Listen() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    listen(fd_, 8);
    thread_ = std::thread([this] { Serve(); });
  }
  void Serve() {
    while (!stop_) {
      const int conn = accept(fd_, nullptr, nullptr);
      if (conn < 0) return;
      char buf[4096];
      for (ssize_t n; (n = read(conn, buf, sizeof buf)) > 0;) {
        // One answer per command of the read (each starts "*<argc>\r\n"; the tests'
        // arguments hold no '*').
        std::string out;
        for (absl::string_view command :
             absl::StrSplit(absl::string_view(buf, size_t(n)), '*', absl::SkipEmpty())) {
          if (absl::StrContains(command, "SLOTS")) {
            out += "-ERR This instance has cluster support disabled\r\n";
          } else if (absl::StrContains(command, "ASKING")) {
            out += "+OK\r\n";
          } else {
            absl::MutexLock lock(&mu_);
            out += reply_;
          }
        }
        if (write(conn, out.data(), out.size()) < 0) break;
      }
      close(conn);
    }
  }

  absl::Mutex mu_;
  std::string reply_ ABSL_GUARDED_BY(mu_);
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_REDIS_GARBAGE_SERVER_H_
