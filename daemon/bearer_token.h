// BearerTokenProcessor: the check --auth_token_file puts on every call over kvarenad's TCP
// listeners. A call must carry `authorization: Bearer <token>` metadata, or it fails with
// UNAUTHENTICATED before it reaches any service (KvCacheService, grpc.health.v1, server
// reflection). The comparison takes the same time wherever a presented token differs, and
// the metadata is consumed: handlers never see the token. Attached to the TCP listeners'
// credentials (daemon/tcp_credentials.h), so Unix-socket calls never meet it.
//
// Thread-safety: immutable; Process runs concurrently on gRPC's threads.
#ifndef KVARENA_DAEMON_BEARER_TOKEN_H_
#define KVARENA_DAEMON_BEARER_TOKEN_H_

#include <grpcpp/security/auth_metadata_processor.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvarena {

inline constexpr char kAuthorizationMetadataKey[] = "authorization";

class BearerTokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  // REQUIRES: token is non-empty (tcp_credentials.cc checks the file).
  explicit BearerTokenProcessor(absl::string_view token);

  // A comparison of a few dozen bytes: run it inline on the call's thread.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  const std::string expected_;  // "Bearer <token>"
};

// Bearer tokens are visible ASCII (0x21..0x7e), at least this long.
inline constexpr size_t kMinTokenBytes = 16;

// The token a file holds (surrounding whitespace dropped). INVALID_ARGUMENT, or the read's
// code, with a message that starts "<what>=<path>": unreadable, shorter than
// kMinTokenBytes, or a byte outside visible ASCII.
absl::StatusOr<std::string> ReadBearerTokenFile(absl::string_view what, const std::string& path);

// Whether presented == secret, in time that depends on secret's length only.
bool ConstantTimeEquals(absl::string_view presented, absl::string_view secret);

}  // namespace kvarena

#endif  // KVARENA_DAEMON_BEARER_TOKEN_H_
