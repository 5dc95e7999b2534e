// The credentials every TCP (HOST:PORT) listener of kvarenad gets: plaintext by default;
// TLS with --tls_cert and --tls_key; mutual TLS with --tls_client_ca as well (a client
// must present a certificate that CA signed, or the handshake fails); a bearer token on
// every call with --auth_token_file (BearerTokenProcessor), which needs TLS, since a token
// must not cross the network in plaintext. Unix listeners never get these: their file
// mode and group guard them (daemon/socket_access.h), and probes and workers of the
// sidecar form need nothing more.
//
// Thread-compatible: called once, at start.
#ifndef KVARENA_DAEMON_TCP_CREDENTIALS_H_
#define KVARENA_DAEMON_TCP_CREDENTIALS_H_

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvarena {

struct TcpSecurityOptions {
  std::string tls_cert;         // PEM certificate chain file
  std::string tls_key;          // PEM private key file
  std::string tls_client_ca;    // PEM bundle of the CAs that client certificates chain to
  std::string auth_token_file;  // a file holding the bearer token (surrounding whitespace dropped)
};

// Checks the combination, reads the files and builds the credentials. INVALID_ARGUMENT
// naming the flag for: a key without a certificate or the reverse; --tls_client_ca or
// --auth_token_file without TLS; any of them while no listener is TCP (!has_tcp); a file
// with no PEM block of the kind wanted; a token shorter than kMinTokenBytes or with bytes
// other than visible ASCII. A file that cannot be read: its errno's code, naming the flag.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpServerCredentials(
    const TcpSecurityOptions& options, bool has_tcp);

// For the start line: "plaintext", "tls" or "mtls", with "+token".
std::string TcpSecurityName(const TcpSecurityOptions& options);

}  // namespace kvarena

#endif  // KVARENA_DAEMON_TCP_CREDENTIALS_H_
