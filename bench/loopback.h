// Loopback helpers for benchmarks that talk to servers of their own (kvarenad's metrics
// endpoint, redis-benchmark): a free port, one HTTP GET and a shell command's output.
// Header-only; thread-compatible.
#ifndef KVARENA_BENCH_LOOPBACK_H_
#define KVARENA_BENCH_LOOPBACK_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace kvarena {

inline sockaddr_in LoopbackAddress(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  return a;
}

// A loopback TCP port nothing listens on now; 0 if none could be bound.
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = LoopbackAddress(0);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// The whole HTTP/1.0 response (headers included) to GET `path` on the loopback port; ""
// when nothing answers.
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const sockaddr_in a = LoopbackAddress(port);
  std::string out;
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 &&
      write(fd, request.data(), request.size()) == ssize_t(request.size())) {
    char buf[65536];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  }
  close(fd);
  return out;
}

// The stdout of `command` run by /bin/sh; "" when it cannot run.
inline std::string CommandOutput(const std::string& command) {
  std::string out;
  if (FILE* f = popen(command.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    pclose(f);
  }
  return out;
}

}  // namespace kvarena

#endif  // KVARENA_BENCH_LOOPBACK_H_
