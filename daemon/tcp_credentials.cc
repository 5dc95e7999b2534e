#include "daemon/tcp_credentials.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/small_file.h"
#include "base/status_macros.h"
#include "core/refusal.h"
#include "daemon/bearer_token.h"

namespace kvarena {
namespace {

// Certificates, keys and tokens are small; a larger file is not one of them.
constexpr size_t kMaxFileBytes = size_t{1} << 20;

// --flag=path's contents, errors prefixed with "--flag=".
absl::StatusOr<std::string> ReadFlagFile(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> out = ReadSmallFile(path, kMaxFileBytes);
  if (!out.ok()) {
    return Annotated(out.status(), absl::StrCat("--", flag, "="));
  }
  return out;
}

// The file's contents when they hold a PEM block whose label ends with `label`.
absl::StatusOr<std::string> ReadPem(absl::string_view flag, const std::string& path,
                                    absl::string_view label) {
  KVARENA_ASSIGN_OR_RETURN(std::string pem, ReadFlagFile(flag, path));
  if (!absl::StrContains(pem, "-----BEGIN ") ||
      !absl::StrContains(pem, absl::StrCat(label, "-----"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, " holds no PEM ", label, " block"));
  }
  return pem;
}

absl::Status CheckCombination(const TcpSecurityOptions& o, bool has_tcp) {
  if (!o.tls_key.empty() && o.tls_cert.empty()) {
    return absl::InvalidArgumentError("--tls_key needs --tls_cert (the certificate it belongs to)");
  }
  if (!o.tls_cert.empty() && o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert needs --tls_key (the certificate's private key)");
  }
  if (!o.tls_client_ca.empty() && o.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca needs --tls_cert and --tls_key: mutual TLS is TLS first");
  }
  if (!o.auth_token_file.empty() && o.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "--auth_token_file needs --tls_cert and --tls_key: a bearer token must not cross the "
        "network in plaintext");
  }
  if (!has_tcp) {
    for (const auto& [flag, value] :
         {std::pair("tls_cert", &o.tls_cert), std::pair("tls_client_ca", &o.tls_client_ca),
          std::pair("auth_token_file", &o.auth_token_file)}) {
      if (!value->empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", flag,
            " is set but --listen has no HOST:PORT address: TLS and the bearer "
            "token guard TCP listeners only (file mode and group guard Unix sockets)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpServerCredentials(
    const TcpSecurityOptions& options, bool has_tcp) {
  KVARENA_RETURN_IF_ERROR(CheckCombination(options, has_tcp));
  if (options.tls_cert.empty()) return grpc::InsecureServerCredentials();

  KVARENA_ASSIGN_OR_RETURN(std::string cert, ReadPem("tls_cert", options.tls_cert, "CERTIFICATE"));
  KVARENA_ASSIGN_OR_RETURN(std::string key, ReadPem("tls_key", options.tls_key, "PRIVATE KEY"));
  grpc::SslServerCredentialsOptions ssl(
      options.tls_client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                    : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  if (!options.tls_client_ca.empty()) {
    KVARENA_ASSIGN_OR_RETURN(std::string ca,
                             ReadPem("tls_client_ca", options.tls_client_ca, "CERTIFICATE"));
    ssl.pem_root_certs = std::move(ca);
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(ssl);
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::string> token =
        ReadBearerTokenFile("--auth_token_file", options.auth_token_file);
    KVARENA_RETURN_IF_ERROR(token.status());
    creds->SetAuthMetadataProcessor(std::make_shared<BearerTokenProcessor>(*token));
  }
  return creds;
}

std::string TcpSecurityName(const TcpSecurityOptions& options) {
  const char* transport = options.tls_cert.empty()        ? "plaintext"
                          : options.tls_client_ca.empty() ? "tls"
                                                          : "mtls";
  return absl::StrCat(transport, options.auth_token_file.empty() ? "" : "+token");
}

}  // namespace kvarena
