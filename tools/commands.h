// The CLI's commands over a connected Client: each returns what to print and the exit
// code, so main() only parses flags and prints.
#ifndef KVARENA_TOOLS_COMMANDS_H_
#define KVARENA_TOOLS_COMMANDS_H_

#include <string>

#include "absl/status/status.h"
#include "kvarena/client.h"

namespace kvarena {

struct CommandResult {
  std::string out;      // for stdout
  absl::Status status;  // printed to stderr when not OK
  int exit_code = 0;
};

// The arena's page statistics (or one cache's, when cache_id is set).
CommandResult StatsCommand(Client& client, const std::string& cache_id, bool json);
// Every cache: id, layers, kv heads, head_dim, dtype, page size, seq_len, pages.
CommandResult CachesCommand(Client& client, bool json);
// grpc.health.v1 Check; exit 0 only when SERVING.
CommandResult HealthCommand(Client& client, const std::string& service, bool json);

}  // namespace kvarena

#endif  // KVARENA_TOOLS_COMMANDS_H_
