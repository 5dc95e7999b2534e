#include "daemon/flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "daemon/byte_size.h"

ABSL_FLAG(std::vector<std::string>, listen, {"unix:/tmp/kvarena.sock"},
          "Where to serve, comma separated: unix:PATH (stale socket files are replaced, "
          "mode 0660) and/or HOST:PORT.");
ABSL_FLAG(std::string, backend, "auto",
          "Memory backend: host (memfd, CPU kernels), cuda (device 0: VMM / IPC regions, "
          "CUDA kernels; exits with an error where the build has no CUDA or no device is "
          "usable) or auto (cuda when usable, else host).");
ABSL_FLAG(kvarena::ByteSize, arena_bytes, kvarena::ByteSize{uint64_t{1} << 30},
          "Arena budget every pool draws from: bytes, or with a unit K/M/G/T (1000s) or "
          "Ki/Mi/Gi/Ti (1024s), e.g. 512Mi.");
ABSL_FLAG(int, page_size, 16, "Tokens per page for caches whose spec leaves page_size 0.");
ABSL_FLAG(absl::Duration, session_grace, absl::Seconds(5),
          "How long a session's caches outlive its broken Attach stream (e.g. 5s, 500ms).");
ABSL_FLAG(int, metrics_port, 0,
          "Serve Prometheus metrics on 0.0.0.0:PORT/metrics; 0 = off.");
ABSL_FLAG(int, num_threads, -1, "CPU attention threads; -1 = one per core.");
ABSL_FLAG(std::string, fd_socket, "",
          "Unix socket that hands pool and scratch-region fds to attached workers (zero-copy "
          "data plane). Empty = the first unix: --listen path + \".fds\" (none when there is "
          "no unix: address); \"none\" = off.");

namespace kvarena {

void ConfigureFlagsUsage() {
  absl::SetProgramUsageMessage(
      "the kvarena KV-cache daemon (gRPC service kvarena.v1.KvCacheService, "
      "grpc.health.v1.Health, server reflection).\nUsage: kvarenad [--listen=unix:PATH,"
      "HOST:PORT] [--arena_bytes=1Gi] [flags]");
  absl::FlagsUsageConfig config;
  const auto ours = [](absl::string_view file) { return absl::StrContains(file, "daemon/"); };
  config.contains_help_flags = ours;
  config.contains_helpshort_flags = ours;
  config.normalize_filename = [](absl::string_view file) {
    const size_t at = file.rfind("daemon/");
    return std::string(at == absl::string_view::npos ? file : file.substr(at));
  };
  absl::SetFlagsUsageConfig(config);
}

DaemonOptions OptionsFromFlags() {
  DaemonOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.backend = absl::GetFlag(FLAGS_backend);
  o.arena_bytes = absl::GetFlag(FLAGS_arena_bytes).bytes;
  o.page_size = absl::GetFlag(FLAGS_page_size);
  o.session_grace = absl::GetFlag(FLAGS_session_grace);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.num_threads = absl::GetFlag(FLAGS_num_threads);
  o.fd_socket = absl::GetFlag(FLAGS_fd_socket);
  return o;
}

}  // namespace kvarena
