#include "client/grpc_status.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvarena {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  // grpc::StatusCode and absl::StatusCode both carry the canonical codes 0..16.
  const auto code = static_cast<absl::StatusCode>(static_cast<int>(status.error_code()));
  std::string message = status.error_message();
  if (code == absl::StatusCode::kUnavailable && !absl::StartsWith(message, kUnavailablePrefix)) {
    message = absl::StrCat(kUnavailablePrefix, message);
  }
  return absl::Status(code, message);
}

}  // namespace kvarena
