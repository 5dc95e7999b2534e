// Time to first token for a shared prefix served from each place kvarena can keep it
// (docs/tiers.md, docs/redis-tier.md), side by side in one run: a miss, an arena hit, a
// host-tier hit, a disk-tier hit (a cold read: every chunk file dropped from the OS page
// cache with posix_fadvise(POSIX_FADV_DONTNEED) before each sample) and a Redis hit on node B
// of a prefix node A computed (over one plain redis-server, then over a 3+3 Redis Cluster).
// The request is prefix_bench's (bench/prefix_workload.h): a
// --system-token system prompt (2048) and a --suffix-token suffix unique to the request (16),
// attention alone as the model, on the served path; TTFT runs from Allocate with the prompt to
// the last prompt position's output on the last layer, computing what was not adopted.
//
// Each mode runs on fresh kvarenad processes (--num_threads=2, --tier_timeout=10s so that no
// load is cut short). A tier mode computes the prefix once, then before every sample fills
// the arena (--arena_bytes=64Mi there) with a namespace-less cache, so that the prefix's pages
// are reclaimed and only a tier holds them; the disk mode's host tier holds 1 MiB (3 chunks),
// so the prefix goes down to disk. The Redis modes start their servers (redis_harness.h;
// skipped with the reason without redis-server and redis-cli) and run `redis-benchmark -t
// set,get` for the chunk's size beside them, as the ceiling (its GET figure; SET first, else
// GET reads a nil).
//
// Per mode: samples, positions adopted and loaded from tiers (of the last sample; a tier
// sample that loaded less than the whole prefix fails the run), Allocate p50, TTFT p50 / p99,
// the daemon's minor page faults a sample (/proc/PID/stat; p50, and per MiB loaded), and for
// tier hits two read rates: K/V payload bytes loaded / Allocate time (lookup, read,
// verification and the copy into the arena, per sample, p50), and chunk value bytes found /
// the summed store read time of kvarena_tier_duration_seconds{op="read"} on /metrics (every
// store's reads, misses in the host tier included; over all samples).
//
// Usage: tier_bench [--kvarenad=PATH] [--samples=N] [--misses=N] [--system=N] [--suffix=N]
//                   [--layers=N] [--quick] [--modes=host,disk,redis,cluster]
//                   [--kv_format=float16|int8|fp8_e4m3] [--kvarenad_flag=FLAG]...
// --modes: the tier rows to run (the miss and arena rows always run); --kv_format: how the
// pages store K/V (q, k and v stay float16; a quantized format moves fewer bytes a hit);
// --kvarenad_flag: one more flag for every daemon (e.g. --kvarenad_flag=--arena_warm_bytes=0,
// repeatable).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/child_daemon.h"
#include "bench/loopback.h"
#include "bench/prefix_workload.h"
#include "bench/tier_ops.h"
#include "tests/redis/redis_harness.h"

namespace kvarena {
namespace {

namespace fs = std::filesystem;

struct Options {
  Workload w;
  int samples = 80, misses = 10;
  std::string kvarenad, dir;
  std::vector<std::string> modes = {"host", "disk", "redis", "cluster"};
  std::vector<std::string> daemon_flags;  // --kvarenad_flag
  bool Runs(const std::string& mode) const {
    return std::find(modes.begin(), modes.end(), mode) != modes.end();
  }
};

struct Row {
  explicit Row(std::string name_in, std::string baseline_in = "")
      : name(std::move(name_in)), baseline(std::move(baseline_in)) {}
  std::string name, baseline, note;
  std::vector<double> ttft_ms, allocate_ms, load_gbps, minflt, minflt_per_mib;
  int64_t adopted = 0, loaded = 0;  // of the last sample
  double store_gbps = 0;            // chunk bytes read / summed store read time (/metrics)
};

std::string FreshDir(const Options& o, const std::string& name) {
  const std::string dir = o.dir + "/" + name;
  fs::create_directories(dir);
  return dir;
}

std::vector<std::string> DaemonFlags(const Options& o, const std::string& arena,
                                     std::vector<std::string> tier_flags) {
  std::vector<std::string> flags = {"--arena_bytes=" + arena, "--num_threads=2",
                                    "--tier_timeout=10s"};
  flags.insert(flags.end(), tier_flags.begin(), tier_flags.end());
  flags.insert(flags.end(), o.daemon_flags.begin(), o.daemon_flags.end());
  return flags;
}

// Sets row.store_gbps from the reads between `before` and now.
absl::Status SetStoreRate(Client& client, int metrics_port, const Workload& w,
                          const ReadTotals& before, Row& row) {
  KVARENA_ASSIGN_OR_RETURN(ReadTotals after, Reads(client, metrics_port));
  const double s = after.read_s - before.read_s;
  if (s > 0)
    row.store_gbps =
        double(after.hit_chunks - before.hit_chunks) * double(ChunkValueBytes(w)) / s / 1e9;
  return absl::OkStatus();
}

// One timed request; adds it to the row. `tier_hit`: the whole system prompt must come from
// the tiers (else the sample is an error: the mode did not measure what it names).
// `pid`: the daemon's, whose minor faults during the request are counted.
absl::Status Sample(Client& client, pid_t pid, const Options& o, const Noise& noise, int system_id,
                    int request, bool tier_hit, Row& row) {
  const Workload& w = o.w;
  const int64_t faults = MinorFaults(pid);
  KVARENA_ASSIGN_OR_RETURN(FirstToken t,
                           TimeFirstToken(client, WorkloadSpec(w, "bench"),
                                          WorkloadPrompt(w, system_id, request), w, noise));
  const int64_t faulted = MinorFaults(pid) - faults;
  KVARENA_RETURN_IF_ERROR(t.cache->release());
  const int64_t chunk_positions = int64_t(ChunkPages(w)) * w.page_size;
  if (tier_hit && t.tier_loaded < w.system / chunk_positions * chunk_positions) {
    return absl::InternalError(absl::StrCat(row.name, ": sample ", request, " loaded ",
                                            t.tier_loaded, " positions from the tiers, want the ",
                                            w.system, " of the prefix"));
  }
  row.ttft_ms.push_back(t.ttft_ms);
  row.allocate_ms.push_back(t.allocate_ms);
  if (faults >= 0) row.minflt.push_back(double(faulted));
  if (t.tier_loaded > 0) {
    const double bytes = double(t.tier_loaded) * PositionBytes(w);
    row.load_gbps.push_back(bytes / (t.allocate_ms * 1e6));
    if (faults >= 0) row.minflt_per_mib.push_back(double(faulted) / (bytes / double(1 << 20)));
  }
  row.adopted = t.cached;
  row.loaded = t.tier_loaded;
  return absl::OkStatus();
}

// The miss and arena-hit rows, on one daemon with a 2 GiB arena and no tiers.
absl::Status RunArena(const Options& o, const Noise& noise, Row& miss, Row& hit) {
  ChildDaemon daemon(o.kvarenad, FreshDir(o, "arena"), DaemonFlags(o, "2Gi", {}));
  const pid_t pid = daemon.pid();
  auto client = ConnectWhenUp(daemon.address(), "tier_bench");
  if (client == nullptr)
    return absl::UnavailableError("kvarenad (arena) never answered; log in " + o.dir);
  for (int i = 0; i < o.misses; ++i)
    KVARENA_RETURN_IF_ERROR(Sample(*client, pid, o, noise, 1000 + i, i, false, miss));
  KVARENA_RETURN_IF_ERROR(Sample(*client, pid, o, noise, 1, 0, false, hit));  // the prefix
  hit.ttft_ms.clear();
  hit.allocate_ms.clear();
  hit.minflt.clear();
  for (int i = 1; i <= o.samples; ++i)
    KVARENA_RETURN_IF_ERROR(Sample(*client, pid, o, noise, 1, i, false, hit));
  return absl::OkStatus();
}

// A tier row: the prefix computed once, then per sample the arena filled first.
absl::Status RunTier(const Options& o, const Noise& noise, const std::string& medium,
                     const std::vector<std::string>& tier_flags, const std::string& disk_dir,
                     Row& row) {
  const int metrics_port = FreePort();
  std::vector<std::string> flags = tier_flags;
  flags.push_back(absl::StrCat("--metrics_port=", metrics_port));
  ChildDaemon daemon(o.kvarenad, FreshDir(o, medium), DaemonFlags(o, "64Mi", flags));
  auto client = ConnectWhenUp(daemon.address(), "tier_bench");
  if (client == nullptr)
    return absl::UnavailableError("kvarenad (" + medium + ") never answered; log in " + o.dir);
  Row warm(medium);
  KVARENA_RETURN_IF_ERROR(Sample(*client, daemon.pid(), o, noise, 1, 0, false, warm));
  const int64_t prefix_chunks = o.w.system / (o.w.page_size * ChunkPages(o.w));
  const int64_t host_chunks = (int64_t{1} << 20) / ChunkValueBytes(o.w);  // the disk mode's
  KVARENA_ASSIGN_OR_RETURN(const ReadTotals before, Reads(*client, metrics_port));
  for (int i = 1; i <= o.samples; ++i) {
    KVARENA_RETURN_IF_ERROR(Pressure(*client, o.w, noise));
    KVARENA_RETURN_IF_ERROR(WaitStored(
        *client, medium, medium == "disk" ? prefix_chunks - host_chunks : prefix_chunks));
    if (!disk_dir.empty()) KVARENA_RETURN_IF_ERROR(DropPageCache(disk_dir));
    KVARENA_RETURN_IF_ERROR(Sample(*client, daemon.pid(), o, noise, 1, i, true, row));
  }
  KVARENA_RETURN_IF_ERROR(SetStoreRate(*client, metrics_port, o.w, before, row));
  KVARENA_ASSIGN_OR_RETURN(ArenaStats stats, client->Stats());
  for (const TierStats& t : stats.tiers) {
    absl::StrAppend(&row.note, row.note.empty() ? "" : ", ", t.medium, " ", t.loaded_tokens,
                    " positions");
  }
  return absl::OkStatus();
}

// redis-benchmark's GET of `bytes`-byte values from the server on `port`, one client, no
// pipeline, in GB/s (SET runs first: a GET of a key never set reads a nil); 0 when it did not
// run.
double RedisCeilingGbps(const std::string& benchmark, bool cluster, int port, int64_t bytes,
                        int requests) {
  const std::string out = CommandOutput(absl::StrCat(
      benchmark, cluster ? " --cluster" : "", " -p ", port, " -t set,get -d ", bytes, " -n ",
      requests, " -c 1 -q 2>/dev/null | tr '\\r' '\\n' | grep '^GET: [0-9]' | tail -1"));
  double rps = 0;
  if (std::sscanf(out.c_str(), "GET: %lf", &rps) != 1) return 0;
  return rps * double(bytes) / 1e9;
}

// Node A computes the prefix (written through to Redis); node B, a separate arena, loads it.
// `cluster`: a 3+3 Redis Cluster, else one plain redis-server (tests/redis/redis_harness.h
// starts them on free loopback ports and SIGKILLs them when it goes, or with the bench).
absl::Status RunRedis(const Options& o, const Noise& noise, bool cluster, Row& row,
                      std::string* ceiling) {
  if (!testing::RedisInstalled()) {
    row.note = "skipped: redis-server or redis-cli is not on $PATH";
    return absl::OkStatus();
  }
  // Started before the daemons: a daemon whose Redis is not up yet drops its writes.
  KVARENA_ASSIGN_OR_RETURN(
      std::unique_ptr<testing::RedisTestCluster> redis,
      testing::RedisTestCluster::Start(cluster ? testing::ClusterOf(3, 1) : testing::PlainRedis()));
  const std::string seeds = "--tier_redis=" + redis->Seeds();
  const int metrics_port = FreePort();
  const std::string node = cluster ? "cluster_node_" : "node_";
  ChildDaemon a(o.kvarenad, FreshDir(o, node + "a"), DaemonFlags(o, "2Gi", {seeds}));
  ChildDaemon b(o.kvarenad, FreshDir(o, node + "b"),
                DaemonFlags(o, "64Mi", {seeds, absl::StrCat("--metrics_port=", metrics_port)}));
  auto client_a = ConnectWhenUp(a.address(), "tier_bench");
  auto client_b = ConnectWhenUp(b.address(), "tier_bench");
  if (client_a == nullptr || client_b == nullptr) {
    return absl::UnavailableError("kvarenad (node A or B) never answered; logs in " + o.dir);
  }
  Row warm("redis");
  KVARENA_RETURN_IF_ERROR(Sample(*client_a, a.pid(), o, noise, 1, 0, false, warm));
  KVARENA_RETURN_IF_ERROR(
      WaitStored(*client_a, "redis", o.w.system / (o.w.page_size * ChunkPages(o.w))));
  KVARENA_ASSIGN_OR_RETURN(const ReadTotals before, Reads(*client_b, metrics_port));
  for (int i = 1; i <= o.samples; ++i) {
    if (i > 1) KVARENA_RETURN_IF_ERROR(Pressure(*client_b, o.w, noise));
    KVARENA_RETURN_IF_ERROR(WaitStored(*client_b, "redis", 0));  // B's own write-through settled
    KVARENA_RETURN_IF_ERROR(Sample(*client_b, b.pid(), o, noise, 1, i, true, row));
  }
  KVARENA_RETURN_IF_ERROR(SetStoreRate(*client_b, metrics_port, o.w, before, row));
  const std::string benchmark = testing::FindProgram("redis-benchmark");
  const int64_t bytes = ChunkValueBytes(o.w);
  const double gbps = benchmark.empty() ? 0
                                        : RedisCeilingGbps(benchmark, cluster, redis->ports()[0],
                                                           bytes, o.samples * 10);
  *ceiling = gbps > 0 ? absl::StrFormat(
                            "redis-benchmark%s -t set,get -d %d -c 1 (one client, no "
                            "pipeline), GET: %.2f GB/s",
                            cluster ? " --cluster" : "", bytes, gbps)
                      : "redis-benchmark did not run";
  return absl::OkStatus();
}

void Print(const Row& r) {
  if (r.ttft_ms.empty()) {
    std::printf("| %s | %s | - | - | - | - | - | - | - | - | %s |\n", r.name.c_str(),
                r.baseline.c_str(), r.note.c_str());
    return;
  }
  const std::string gbps =
      r.load_gbps.empty() ? "-" : absl::StrFormat("%.2f", Percentile(r.load_gbps, 50));
  const std::string store = r.store_gbps > 0 ? absl::StrFormat("%.2f", r.store_gbps) : "-";
  std::string faults = r.minflt.empty() ? "-" : absl::StrFormat("%.0f", Percentile(r.minflt, 50));
  if (!r.minflt_per_mib.empty())
    absl::StrAppendFormat(&faults, " (%.2f / MiB)", Percentile(r.minflt_per_mib, 50));
  std::printf("| %s | %s | %zu | %lld / %lld | %.2f | %.1f | %.1f | %s | %s | %s | %s |\n",
              r.name.c_str(), r.baseline.c_str(), r.ttft_ms.size(),
              static_cast<long long>(r.adopted), static_cast<long long>(r.loaded),
              Percentile(r.allocate_ms, 50), Percentile(r.ttft_ms, 50), Percentile(r.ttft_ms, 99),
              gbps.c_str(), store.c_str(), faults.c_str(), r.note.c_str());
  std::fflush(stdout);
}

int Run(Options& o, const std::string& command) {
  const Workload& w = o.w;
  char dir_template[] = "/tmp/kvarena_tier_bench.XXXXXX";
  o.dir = mkdtemp(dir_template);
  std::printf("$ %s\n", command.c_str());
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) == 0) {
      std::printf("%s\n", line.c_str());
      break;
    }
  }
  std::printf(
      "tier_bench: %d-token shared prefix + %d-token unique suffix; %d layers, %d kv heads, %d q "
      "heads, head_dim %d, float16 (pages: %s), page %d (%.0f KiB of K/V a page over every "
      "layer: a chunk of "
      "%d page(s), %lld-byte values); served path, kvarenad --num_threads=2 --tier_timeout=10s; "
      "%d samples a hit mode, %d misses; daemons and logs in %s\n",
      w.system, w.suffix, w.layers, w.kv_heads, w.q_heads, w.head_dim,
      KvFormatName(ResolveKvFormat(w.kv_format, w.dtype)), w.page_size,
      PositionBytes(w) * w.page_size / 1024, ChunkPages(w),
      static_cast<long long>(ChunkValueBytes(w)), o.samples, o.misses, o.dir.c_str());
  std::fflush(stdout);
  const Noise noise(w, w.system + w.suffix, 7);
  Row miss("miss", "computes every position"),
      arena("arena hit", "arena, no tiers (--arena_bytes=2Gi)");
  Row host("host-tier hit",
           "--arena_bytes=64Mi --tier_host_bytes=256Mi, arena filled before each sample");
  Row disk("disk-tier hit (cold)",
           "--arena_bytes=64Mi --tier_host_bytes=1Mi --tier_disk_bytes=1Gi, arena filled and chunk "
           "files fadvise(DONTNEED) before each sample");
  Row redis("Redis hit on node B",
            "node A computed it; A and B: --tier_redis=one plain "
            "redis-server; B: --arena_bytes=64Mi, filled before each sample");
  Row cluster("Redis Cluster hit on node B", "as the Redis row, over a 3+3 Redis Cluster");
  std::string ceiling, cluster_ceiling;
  std::printf(
      "| mode | setup | samples | adopted / from tiers | Allocate p50 (ms) | TTFT p50 (ms) | "
      "TTFT p99 (ms) | load GB/s p50 (payload / Allocate) | store read GB/s (/metrics) | "
      "daemon minor faults p50 (per MiB loaded) | note |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n");
  absl::Status s = RunArena(o, noise, miss, arena);
  if (s.ok()) {
    Print(miss);
    Print(arena);
  }
  for (Row* r : {&host, &disk, &redis, &cluster}) {
    if (!s.ok()) break;
    const std::string mode = r == &host    ? "host"
                             : r == &disk  ? "disk"
                             : r == &redis ? "redis"
                                           : "cluster";
    if (!o.Runs(mode)) {
      r->note = "not run (--modes)";
    } else if (r == &host) {
      s = RunTier(o, noise, "host", {"--tier_host_bytes=256Mi"}, "", host);
    } else if (r == &disk) {
      const std::string disk_dir = FreshDir(o, "disk/chunks");
      s = RunTier(o, noise, "disk",
                  {"--tier_host_bytes=1Mi", "--tier_disk_dir=" + disk_dir, "--tier_disk_bytes=1Gi"},
                  disk_dir, disk);
    } else {
      s = RunRedis(o, noise, /*cluster=*/r == &cluster, *r,
                   r == &cluster ? &cluster_ceiling : &ceiling);
    }
    if (s.ok()) Print(*r);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "tier_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  const double m = Percentile(miss.ttft_ms, 50);
  std::printf("TTFT p50 vs a miss, lower by:");
  for (const Row* r : {&arena, &host, &disk, &redis, &cluster}) {
    if (r->ttft_ms.empty())
      std::printf(" %s skipped;", r->name.c_str());
    else
      std::printf(" %s %.1fx;", r->name.c_str(), m / Percentile(r->ttft_ms, 50));
  }
  std::printf("\n");
  if (!ceiling.empty()) std::printf("Redis ceiling for the same value size: %s\n", ceiling.c_str());
  if (!cluster_ceiling.empty()) std::printf("Redis Cluster ceiling: %s\n", cluster_ceiling.c_str());
  std::error_code ec;
  fs::remove_all(o.dir, ec);
  return 0;
}

}  // namespace
}  // namespace kvarena

int main(int argc, char** argv) {
  kvarena::Options o;
  o.w.suffix = 16;
  o.w.layers = 4;
  o.w.kv_heads = 8;
  o.w.q_heads = 8;
  o.w.head_dim = 128;
  o.w.dtype = kvarena::DType::kFloat16;
  o.kvarenad = kvarena::DefaultKvarenadPath();
  std::vector<std::string> args(argv, argv + argc);
  auto int_flag = [](const std::string& arg, const char* name, int* out) {
    const std::string prefix = std::string("--") + name + "=";
    if (arg.rfind(prefix, 0) != 0) return false;
    *out = std::max(1, std::atoi(arg.c_str() + prefix.size()));
    return true;
  };
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--quick") {
      o.samples = 4;
      o.misses = 2;
      o.w.system = 512;
    } else if (arg.rfind("--kvarenad=", 0) == 0) {
      o.kvarenad = arg.substr(11);
    } else if (arg.rfind("--kvarenad_flag=", 0) == 0) {
      o.daemon_flags.push_back(arg.substr(16));
    } else if (arg.rfind("--kv_format=", 0) == 0) {
      o.w.kv_format = kvarena::KvFormat::kUnspecified;
      for (const kvarena::KvFormatInfo& f : kvarena::kKvFormats) {
        if (arg.substr(12) == f.name) o.w.kv_format = f.format;
      }
      if (o.w.kv_format == kvarena::KvFormat::kUnspecified) {
        std::fprintf(stderr, "tier_bench: unknown %s\n", arg.c_str());
        return 2;
      }
    } else if (arg.rfind("--modes=", 0) == 0) {
      o.modes = absl::StrSplit(arg.substr(8), ',', absl::SkipEmpty());
    } else if (!int_flag(arg, "samples", &o.samples) && !int_flag(arg, "misses", &o.misses) &&
               !int_flag(arg, "system", &o.w.system) && !int_flag(arg, "suffix", &o.w.suffix) &&
               !int_flag(arg, "layers", &o.w.layers)) {
      std::fprintf(stderr,
                   "usage: %s [--kvarenad=PATH] [--samples=N] [--misses=N] [--system=N] "
                   "[--suffix=N] [--layers=N] [--quick] [--modes=host,disk,redis,cluster] "
                   "[--kv_format=float16|int8|fp8_e4m3] [--kvarenad_flag=FLAG]...\n",
                   argv[0]);
      return 2;
    }
  }
  return kvarena::Run(o, absl::StrJoin(args, " "));
}
