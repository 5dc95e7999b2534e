// Test support for kvarenad's TCP listeners: TestPki, certificates made with the openssl
// command at test time, and TcpDaemonTest, a fixture that runs the real kvarenad on a
// Unix socket and 127.0.0.1:0 and reaches the TCP port with chosen credentials.
//
// Thread-compatible: one test thread drives it.
#ifndef KVARENA_TESTS_ACCESS_TCP_FIXTURE_H_
#define KVARENA_TESTS_ACCESS_TCP_FIXTURE_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "tests/daemon/daemon_process.h"

namespace kvarena {

// PEM files: a CA; a server certificate it signed for IP:127.0.0.1 and DNS:localhost; a
// client certificate it signed; a second CA and a client certificate of its own.
struct TestPki {
  std::string ca, server_cert, server_key, client_cert, client_key;
  std::string other_ca, other_client_cert, other_client_key;
  std::string token_file;  // holds kToken and a newline
};

inline constexpr char kToken[] = "kvarena-test-token-0123456789abcdef";

// The process's certificates, made on first use in a temporary directory that lives as
// long as the process; an error carries openssl's output.
const absl::StatusOr<TestPki>& SharedPki();

class TcpDaemonTest : public ::testing::Test {
 protected:
  // Skips when the openssl command is missing; fails when it could not make the files.
  void SetUp() override;

  // Starts kvarenad on unix:<dir>/kvarena.sock,127.0.0.1:0 with `flags`, waits for
  // SERVING (over the Unix socket) and learns the TCP port from the start line.
  void Start(std::vector<std::string> flags);
  // "127.0.0.1:PORT"
  std::string tcp_address() const;

  // A new channel (sharing no connection) to the TCP address.
  std::shared_ptr<grpc::Channel> TcpChannel(
      const std::shared_ptr<grpc::ChannelCredentials>& credentials) const;
  // TLS trusting `ca`, with a client certificate when cert is set.
  static std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& ca,
                                                       const std::string& cert = "",
                                                       const std::string& key = "");
  // KvCacheService/Ping with `authorization` metadata when it is non-empty.
  static grpc::Status Ping(const std::shared_ptr<grpc::Channel>& channel,
                           const std::string& authorization = "");

  static const TestPki& pki() { return *SharedPki(); }

  TempDir sockets_;  // the Unix socket's directory; outlives daemon_
  std::unique_ptr<DaemonProcess> daemon_;
  int port_ = 0;
};

}  // namespace kvarena

#endif  // KVARENA_TESTS_ACCESS_TCP_FIXTURE_H_
