// The gRPC channel credentials a remote client connects with, from ClientOptions' TLS and
// token fields (kvarena/client.h): insecure unless tls_ca_file is set; then TLS verified
// against that CA bundle, with a client certificate for mutual TLS, and with a bearer
// token on every call (grpc::AccessTokenCredentials: `authorization: Bearer <token>`). A
// unix: address takes a token only (a tenant's, for a daemon with --tenants_file), over
// gRPC's local credentials.
//
// Thread-compatible: called once per Connect.
#ifndef KVARENA_CLIENT_CHANNEL_CREDENTIALS_H_
#define KVARENA_CLIENT_CHANNEL_CREDENTIALS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvarena/client.h"

namespace kvarena::client_internal {

// Whether any TLS or token option is set.
bool HasTcpSecurity(const ClientOptions& options);

// The credentials for `address`; sets the TLS target name override on *args. Errors as
// Client::Connect documents them, each naming the option.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> NewChannelCredentials(
    const std::string& address, const ClientOptions& options, grpc::ChannelArguments* args);

}  // namespace kvarena::client_internal

#endif  // KVARENA_CLIENT_CHANNEL_CREDENTIALS_H_
