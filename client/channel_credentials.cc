#include "client/channel_credentials.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/small_file.h"
#include "base/status_macros.h"
#include "core/refusal.h"

namespace kvarena::client_internal {
namespace {

// Certificates, keys and tokens are small; a larger file is not one of them.
constexpr size_t kMaxFileBytes = size_t{1} << 20;

// option=path's contents, errors prefixed with "Connect: option=".
absl::StatusOr<std::string> ReadOptionFile(absl::string_view option, const std::string& path) {
  absl::StatusOr<std::string> out = ReadSmallFile(path, kMaxFileBytes);
  if (!out.ok()) {
    return Annotated(out.status(), absl::StrCat("Connect: ", option, "="));
  }
  return out;
}

// The token from auth_token or auth_token_file; "" when neither is set.
absl::StatusOr<std::string> Token(const ClientOptions& o) {
  std::string token = o.auth_token;
  if (!o.auth_token_file.empty()) {
    KVARENA_ASSIGN_OR_RETURN(std::string file,
                             ReadOptionFile("auth_token_file", o.auth_token_file));
    token = std::string(absl::StripAsciiWhitespace(file));
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Connect: auth_token_file=", o.auth_token_file, " holds no token"));
    }
  }
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Connect: byte %d of the auth token is 0x%02x; a token is visible ASCII (0x21..0x7e)", i,
          c));
    }
  }
  return token;
}

absl::Status CheckCombination(const std::string& address, const ClientOptions& o) {
  if (absl::StartsWith(address, "unix:")) {
    if (o.tls_ca_file.empty() && o.tls_cert_file.empty() && o.tls_key_file.empty() &&
        o.tls_target_name.empty() && !(!o.auth_token.empty() && !o.auth_token_file.empty())) {
      return absl::OkStatus();  // a tenant's token (the daemon's --tenants_file) only
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "Connect: tls_* options apply to HOST:PORT addresses; ", address,
        " is guarded by file permissions (the daemon's --socket_mode and --socket_group) and "
        "takes only a tenant's auth_token or auth_token_file (not both)"));
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        o.tls_key_file.empty() ? "Connect: tls_cert_file needs tls_key_file (its private key)"
                               : "Connect: tls_key_file needs tls_cert_file (its certificate)");
  }
  if (!o.auth_token.empty() && !o.auth_token_file.empty()) {
    return absl::InvalidArgumentError("Connect: give auth_token or auth_token_file, not both");
  }
  if (o.tls_ca_file.empty() && (!o.auth_token.empty() || !o.auth_token_file.empty())) {
    return absl::InvalidArgumentError(
        "Connect: auth_token needs tls_ca_file: a bearer token must not cross the network in "
        "plaintext");
  }
  if (o.tls_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "Connect: tls_cert_file, tls_key_file and tls_target_name need tls_ca_file (TLS is on "
        "when it is set)");
  }
  return absl::OkStatus();
}

}  // namespace

bool HasTcpSecurity(const ClientOptions& o) {
  return !o.tls_ca_file.empty() || !o.tls_cert_file.empty() || !o.tls_key_file.empty() ||
         !o.tls_target_name.empty() || !o.auth_token.empty() || !o.auth_token_file.empty();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> NewChannelCredentials(
    const std::string& address, const ClientOptions& options, grpc::ChannelArguments* args) {
  if (!HasTcpSecurity(options)) return grpc::InsecureChannelCredentials();
  KVARENA_RETURN_IF_ERROR(CheckCombination(address, options));
  if (absl::StartsWith(address, "unix:")) {
    // gRPC sends call credentials only over a channel it deems private: a Unix socket's
    // local credentials are (the daemon's side needs nothing of them).
    KVARENA_ASSIGN_OR_RETURN(std::string token, Token(options));
    return grpc::CompositeChannelCredentials(grpc::experimental::LocalCredentials(UDS),
                                             grpc::AccessTokenCredentials(token));
  }
  grpc::SslCredentialsOptions ssl;
  KVARENA_ASSIGN_OR_RETURN(std::string ca, ReadOptionFile("tls_ca_file", options.tls_ca_file));
  ssl.pem_root_certs = std::move(ca);
  if (!options.tls_cert_file.empty()) {
    KVARENA_ASSIGN_OR_RETURN(std::string cert,
                             ReadOptionFile("tls_cert_file", options.tls_cert_file));
    KVARENA_ASSIGN_OR_RETURN(std::string key, ReadOptionFile("tls_key_file", options.tls_key_file));
    ssl.pem_cert_chain = std::move(cert);
    ssl.pem_private_key = std::move(key);
  }
  if (!options.tls_target_name.empty()) args->SetSslTargetNameOverride(options.tls_target_name);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(ssl);
  KVARENA_ASSIGN_OR_RETURN(std::string token, Token(options));
  if (!token.empty()) {
    creds = grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(token));
  }
  return creds;
}

}  // namespace kvarena::client_internal
