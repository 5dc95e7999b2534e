#include "daemon/bearer_token.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/small_file.h"
#include "core/refusal.h"

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

absl::StatusOr<std::string> ReadBearerTokenFile(absl::string_view what, const std::string& path) {
  constexpr size_t kMaxTokenFileBytes = 4096;
  absl::StatusOr<std::string> file = ReadSmallFile(path, kMaxTokenFileBytes);
  if (!file.ok()) {
    return Annotated(file.status(), absl::StrCat(what, "="));
  }
  const absl::string_view token = absl::StripAsciiWhitespace(*file);
  if (token.size() < kMinTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "=", path, ": the token has ", token.size(), " bytes; use at least ",
                     kMinTokenBytes, " (e.g. the output of `openssl rand -hex 32`)"));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s=%s: byte %d of the token is 0x%02x; a token is visible ASCII (0x21..0x7e), as a "
          "header value carries it",
          what, path, i, c));
    }
  }
  return std::string(token);
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
