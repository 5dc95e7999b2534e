// The daemon's one mapping from core statuses to gRPC statuses. Pure; thread-safe.
#ifndef KVARENA_DAEMON_STATUS_H_
#define KVARENA_DAEMON_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kvarena {

// absl and gRPC both use the canonical google.rpc codes, so codes map 1:1 and the
// message is kept verbatim (clients and tests match on it).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace kvarena

#endif  // KVARENA_DAEMON_STATUS_H_
