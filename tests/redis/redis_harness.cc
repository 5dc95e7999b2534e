#include "tests/redis/redis_harness.h"

#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kvarena::testing {
namespace {

bool PortFree(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(uint16_t(port));
  const bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return free;
}

// The "ip:port@cport" field of a CLUSTER NODES line as its port.
int PortOfNodeField(absl::string_view field) {
  field = field.substr(0, field.find('@'));
  int port = 0;
  return absl::SimpleAtoi(field.substr(field.rfind(':') + 1), &port) ? port : -1;
}

}  // namespace

std::string FindProgram(const std::string& name) {
  const char* path = getenv("PATH");
  std::vector<std::string> dirs = absl::StrSplit(path != nullptr ? path : "", ':');
  dirs.push_back("/usr/bin");
  dirs.push_back("/usr/sbin");
  for (const std::string& dir : dirs) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

bool RedisInstalled() {
  return !FindProgram("redis-server").empty() && !FindProgram("redis-cli").empty();
}

int PickRedisPort() {
  // Below Linux's ephemeral range (32768-60999), where connections' own ports come from.
  static std::mt19937 rng{std::random_device{}()};
  std::uniform_int_distribution<int> pick(12000, 22000);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = pick(rng);
    if (PortFree(port) && PortFree(port + 10000)) return port;
  }
  return 0;
}

RedisTestClusterOptions PlainRedis() {
  RedisTestClusterOptions options;
  options.cluster = false;
  options.primaries = 1;
  options.replicas = 0;
  return options;
}

RedisTestClusterOptions ClusterOf(int primaries, int replicas) {
  RedisTestClusterOptions options;
  options.primaries = primaries;
  options.replicas = replicas;
  return options;
}

absl::StatusOr<std::unique_ptr<RedisTestCluster>> RedisTestCluster::Start(
    const RedisTestClusterOptions& options) {
  const int count = options.primaries * (1 + options.replicas);
  if (!options.cluster && count != 1) {
    return absl::InvalidArgumentError("a plain redis-server is one primary, no replica");
  }
  std::unique_ptr<RedisTestCluster> c(new RedisTestCluster());
  c->cli_password_ = options.cli_password;
  if (c->dir_.path().empty()) return absl::InternalError("no temporary directory");
  c->ports_ = options.ports;
  std::set<int> taken(c->ports_.begin(), c->ports_.end());
  while (int(c->ports_.size()) < count) {
    const int port = PickRedisPort();
    if (port == 0) return absl::UnavailableError("no free loopback port pair");
    if (taken.insert(port).second) c->ports_.push_back(port);
  }
  for (int& port : c->ports_) {
    absl::Status s = c->StartServer(port, options);
    // A picked port another process took meanwhile (ctest -j): another one.
    for (int retry = 0; !s.ok() && options.ports.empty() && retry < 3; ++retry) {
      const int other = PickRedisPort();
      if (other == 0 || !taken.insert(other).second) continue;
      port = other;
      s = c->StartServer(port, options);
    }
    if (!s.ok()) return s;
  }
  if (!options.cluster) return c;
  std::vector<std::string> create = {"--cluster", "create"};
  for (int port : c->ports_) create.push_back(absl::StrCat("127.0.0.1:", port));
  create.insert(create.end(),
                {"--cluster-replicas", absl::StrCat(options.replicas), "--cluster-yes"});
  absl::StatusOr<std::string> created = c->Cli(c->ports_[0], create);
  if (!created.ok()) return created.status();
  absl::Status ok = c->WaitClusterOk(absl::Seconds(30));
  if (!ok.ok()) return ok;
  return c;
}

RedisTestCluster::~RedisTestCluster() {
  servers_.clear();  // SIGKILL and reap each (Subprocess's destructor), then dir_ goes
}

absl::Status RedisTestCluster::StartServer(int port, const RedisTestClusterOptions& options) {
  const std::string dir = absl::StrCat(dir_.path(), "/", port);
  std::filesystem::create_directories(dir);
  std::vector<std::string> argv = {FindProgram("redis-server"),
                                   "--port",
                                   absl::StrCat(port),
                                   "--bind",
                                   "127.0.0.1",
                                   "--dir",
                                   dir,
                                   "--save",
                                   "",
                                   "--appendonly",
                                   "no",
                                   "--protected-mode",
                                   "no"};
  if (options.cluster) {
    argv.insert(argv.end(), {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                             "--cluster-node-timeout", "1000",
                             // the other primaries answer while one fails over
                             "--cluster-require-full-coverage", "no",
                             // fail over whatever the replica's link history
                             "--cluster-replica-validity-factor", "0"});
  }
  argv.insert(argv.end(), options.server_args.begin(), options.server_args.end());
  auto server = std::make_unique<Subprocess>();
  absl::Status s = server->Start(argv);
  if (!s.ok()) return s;
  if (!server->WaitForOutput("Ready to accept connections", absl::Seconds(20))) {
    return absl::UnavailableError(
        absl::StrCat("redis-server on port ", port, " did not start:\n", server->output()));
  }
  servers_.push_back(std::move(server));
  killed_.push_back(false);
  return absl::OkStatus();
}

std::string RedisTestCluster::Seeds() const {
  return absl::StrJoin(
      ports_, ",", [](std::string* out, int port) { absl::StrAppend(out, "127.0.0.1:", port); });
}

absl::StatusOr<std::string> RedisTestCluster::Cli(int port,
                                                  const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {FindProgram("redis-cli"), "-h", "127.0.0.1", "-p",
                                   absl::StrCat(port)};
  if (!cli_password_.empty()) argv.insert(argv.end(), {"-a", cli_password_, "--no-auth-warning"});
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess cli;
  absl::Status s = cli.Start(argv);
  if (!s.ok()) return s;
  absl::StatusOr<int> status = cli.Wait(absl::Seconds(20));
  const std::string what = absl::StrCat("redis-cli -p ", port, " ", absl::StrJoin(args, " "));
  if (!status.ok()) return absl::DeadlineExceededError(absl::StrCat(what, ": still running"));
  if (*status != 0 || absl::StartsWith(cli.output(), "ERR")) {
    return absl::InternalError(
        absl::StrCat(what, ": ", DescribeWaitStatus(*status), "\n", cli.output()));
  }
  return cli.output();
}

absl::StatusOr<std::string> RedisTestCluster::NodeId(int port) const {
  absl::StatusOr<std::string> id = Cli(port, {"CLUSTER", "MYID"});
  if (!id.ok()) return id.status();
  return std::string(absl::StripAsciiWhitespace(*id));
}

absl::StatusOr<std::vector<std::vector<std::string>>> RedisTestCluster::ClusterNodes(
    int port) const {
  absl::StatusOr<std::string> text = Cli(port, {"CLUSTER", "NODES"});
  if (!text.ok()) return text.status();
  std::vector<std::vector<std::string>> lines;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipWhitespace())) {
    lines.push_back(absl::StrSplit(line, ' ', absl::SkipEmpty()));
    if (lines.back().size() < 8) return absl::InternalError(absl::StrCat("CLUSTER NODES: ", line));
  }
  return lines;
}

absl::StatusOr<std::vector<int>> RedisTestCluster::Primaries() const {
  absl::StatusOr<std::vector<std::vector<std::string>>> nodes = ClusterNodes(ports_[0]);
  if (!nodes.ok()) return nodes.status();
  std::vector<int> primaries;
  for (const auto& n : *nodes) {
    // id addr flags master ping pong epoch link slots...: a primary owning slots
    if (absl::StrContains(n[2], "master") && !absl::StrContains(n[2], "fail") && n.size() > 8) {
      primaries.push_back(PortOfNodeField(n[1]));
    }
  }
  return primaries;
}

absl::StatusOr<int> RedisTestCluster::ReplicaOf(int primary_port) const {
  absl::StatusOr<std::string> id = NodeId(primary_port);
  if (!id.ok()) return id.status();
  absl::StatusOr<std::vector<std::vector<std::string>>> nodes = ClusterNodes(primary_port);
  if (!nodes.ok()) return nodes.status();
  for (const auto& n : *nodes) {
    if (absl::StrContains(n[2], "slave") && n[3] == *id) return PortOfNodeField(n[1]);
  }
  return absl::NotFoundError(absl::StrCat("no replica of the primary on port ", primary_port));
}

absl::Status RedisTestCluster::WaitClusterOk(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  for (size_t i = 0; i < ports_.size(); ++i) {
    while (!killed_[i]) {
      absl::StatusOr<std::string> info = Cli(ports_[i], {"CLUSTER", "INFO"});
      if (info.ok() && absl::StrContains(*info, "cluster_state:ok")) break;
      last = info.ok() ? *info : std::string(info.status().message());
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("port ", ports_[i], " not cluster_state:ok: ", last));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  return absl::OkStatus();
}

absl::Status RedisTestCluster::WaitReplicated(int primary_port, absl::Duration timeout) const {
  // Right after `--cluster create` the primary may not list its replica yet: the replica's
  // role reaches it by gossip, so the lookup is part of what is waited for.
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::StatusOr<int> replica = ReplicaOf(primary_port);
    absl::Status last = replica.status();
    if (replica.ok()) {
      absl::StatusOr<std::string> a = Cli(primary_port, {"DBSIZE"});
      absl::StatusOr<std::string> b = Cli(*replica, {"DBSIZE"});
      if (a.ok() && b.ok() && absl::StripAsciiWhitespace(*a) == absl::StripAsciiWhitespace(*b)) {
        return absl::OkStatus();
      }
      last = absl::DeadlineExceededError(
          absl::StrCat("replica ", *replica, " of ", primary_port, " not caught up"));
    }
    if (absl::Now() > deadline) return last;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status RedisTestCluster::WaitPrimary(int port, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  for (size_t i = 0; i < ports_.size(); ++i) {
    std::string last = "not asked yet";
    while (!killed_[i]) {
      absl::StatusOr<std::vector<std::vector<std::string>>> nodes = ClusterNodes(ports_[i]);
      bool primary = false;
      if (nodes.ok()) {
        for (const auto& n : *nodes) {
          // id addr flags master ping pong epoch link slots...
          primary = primary || (PortOfNodeField(n[1]) == port &&
                                absl::StrContains(n[2], "master") && n.size() > 8);
        }
      }
      if (primary) break;
      last = nodes.ok() ? "it is no primary owning slots" : std::string(nodes.status().message());
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("port ", ports_[i], " does not see port ", port, " as a primary: ", last));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  return absl::OkStatus();
}

void RedisTestCluster::Signal(int port, int sig) {
  for (size_t i = 0; i < ports_.size(); ++i) {
    if (ports_[i] != port) continue;
    servers_[i]->Signal(sig);
    if (sig == SIGKILL) killed_[i] = true;
  }
}

}  // namespace kvarena::testing
