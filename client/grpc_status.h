// The one mapping from gRPC statuses to absl::Status on the client side (the daemon owns
// the other direction, ToGrpcStatus). Codes map one to one (both follow the canonical
// google.rpc codes); the message is kept, and UNAVAILABLE gains a prefix that says the
// daemon is what is missing. Pure function; thread-safe.
#ifndef KVARENA_CLIENT_GRPC_STATUS_H_
#define KVARENA_CLIENT_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kvarena {

inline constexpr char kUnavailablePrefix[] = "kvarena daemon unavailable: ";

absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kvarena

#endif  // KVARENA_CLIENT_GRPC_STATUS_H_
