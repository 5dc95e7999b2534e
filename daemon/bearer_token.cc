#include "daemon/bearer_token.h"

#include "absl/strings/str_cat.h"

namespace kvarena {

BearerTokenProcessor::BearerTokenProcessor(absl::string_view token)
    : expected_(absl::StrCat("Bearer ", token)) {}

grpc::Status BearerTokenProcessor::Process(const InputMetadata& auth_metadata,
                                           grpc::AuthContext* /*context*/,
                                           OutputMetadata* consumed_auth_metadata,
                                           OutputMetadata* /*response_metadata*/) {
  const auto [first, last] = auth_metadata.equal_range(kAuthorizationMetadataKey);
  if (first == last) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "kvarenad: this listener requires 'authorization: Bearer <token>' "
                        "metadata (the token in kvarenad's --auth_token_file)");
  }
  bool match = false;
  for (auto it = first; it != last; ++it) {
    match |= ConstantTimeEquals(absl::string_view(it->second.data(), it->second.size()), expected_);
    consumed_auth_metadata->emplace(kAuthorizationMetadataKey,
                                    std::string(it->second.data(), it->second.size()));
  }
  if (!match) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "kvarenad: the bearer token does not match --auth_token_file");
  }
  return grpc::Status::OK;
}

bool ConstantTimeEquals(absl::string_view presented, absl::string_view secret) {
  // Every byte of secret is visited whatever presented holds; differences accumulate.
  unsigned char diff = presented.size() == secret.size() ? 0 : 1;
  for (size_t i = 0; i < secret.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= p ^ static_cast<unsigned char>(secret[i]);
  }
  return diff == 0;
}

}  // namespace kvarena
