// kvarena: the operator's CLI for a kvarenad daemon.
//
//   kvarena stats [--cache=ID] [--json]   page statistics of the arena (or of one cache)
//   kvarena caches [--json]               the caches, one row each
//   kvarena health [--service=NAME]       SERVING / NOT_SERVING; exit 0 only when SERVING
//
// --address picks the daemon (default unix:/tmp/kvarena.sock); over HOST:PORT,
// --tls_ca_file turns on TLS, --tls_cert_file / --tls_key_file add a client certificate
// (mutual TLS) and --auth_token_file sends the daemon's bearer token. --json prints the wire
// message (kvarena.v1.StatsResponse / PageStats / ListCachesResponse) as proto3 JSON with
// the proto field names and every field present, the shape grpcurl scripts expect.
// Exit status: 0 ok, 1 the daemon answered an error or is unreachable, 2 bad usage.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kvarena/client.h"
#include "tools/commands.h"

ABSL_FLAG(std::string, address, kvarena::kDefaultAddress,
          "kvarenad address: unix:PATH or HOST:PORT");
ABSL_FLAG(bool, json, false, "print JSON (proto3 JSON of the wire message)");
ABSL_FLAG(std::string, cache, "", "stats: one cache's page stats instead of the arena's");
ABSL_FLAG(std::string, service, "", "health: the service to check (\"\": the server)");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(5), "deadline of each call");
ABSL_FLAG(std::string, tls_ca_file, "",
          "HOST:PORT over TLS: the PEM CA bundle the daemon's certificate must chain to");
ABSL_FLAG(std::string, tls_cert_file, "", "mutual TLS: this client's PEM certificate chain");
ABSL_FLAG(std::string, tls_key_file, "", "mutual TLS: the private key of --tls_cert_file");
ABSL_FLAG(std::string, tls_target_name, "",
          "the name the daemon's certificate must carry, when not the address's host");
ABSL_FLAG(std::string, auth_token_file, "",
          "a file holding the daemon's bearer token (needs --tls_ca_file); a file, not a flag "
          "value, so the token stays out of the process list");

// CMake defines it from project(VERSION) (tools/CMakeLists.txt); Bazel has no version.
#ifndef KVARENA_VERSION
#define KVARENA_VERSION "(unversioned: not built by CMake)"
#endif

namespace {

constexpr char kUsage[] =
    "inspect a kvarenad KV-cache daemon.\n"
    "Usage:\n"
    "  kvarena stats [--cache=ID] [--json]\n"
    "  kvarena caches [--json]\n"
    "  kvarena health [--service=NAME]\n"
    "Common flags: --address=unix:/tmp/kvarena.sock (or HOST:PORT), --timeout=5s;\n"
    "  HOST:PORT: --tls_ca_file=CA.pem [--tls_cert_file=C.pem --tls_key_file=K.pem]\n"
    "  [--tls_target_name=NAME] [--auth_token_file=FILE]";

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  absl::FlagsUsageConfig config;
  // --version: CMake's project VERSION, as kvarenad --version prints it.
  config.version_string = [] { return std::string("kvarena " KVARENA_VERSION "\n"); };
  absl::SetFlagsUsageConfig(config);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "kvarena: %s\n", kUsage);
    return 2;
  }
  const std::string command = args[1];

  kvarena::ClientOptions options;
  options.attach = false;  // read-only: no session, nothing owned
  options.client_name = "kvarena-cli";
  options.call_timeout = absl::GetFlag(FLAGS_timeout);
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca_file);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.tls_target_name = absl::GetFlag(FLAGS_tls_target_name);
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  auto client = kvarena::Client::Connect(absl::GetFlag(FLAGS_address), options);
  if (!client.ok()) {
    std::fprintf(stderr, "kvarena: %s\n", client.status().ToString().c_str());
    return 1;
  }
  kvarena::CommandResult r;
  const bool json = absl::GetFlag(FLAGS_json);
  if (command == "stats") {
    r = kvarena::StatsCommand(**client, absl::GetFlag(FLAGS_cache), json);
  } else if (command == "caches") {
    r = kvarena::CachesCommand(**client, json);
  } else if (command == "health") {
    r = kvarena::HealthCommand(**client, absl::GetFlag(FLAGS_service), json);
  } else {
    std::fprintf(stderr, "kvarena: unknown command '%s'\n%s\n", command.c_str(), kUsage);
    return 2;
  }
  std::fputs(r.out.c_str(), stdout);
  if (!r.status.ok()) std::fprintf(stderr, "kvarena: %s\n", r.status.ToString().c_str());
  return r.exit_code;
}
