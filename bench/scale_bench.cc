// Scale: how Reserve+Commit, Stats and the daemon's memory behave as the number of live
// caches grows. Starts the real kvarenad as a child process (host backend) on a Unix
// socket, then grows the live caches through 10, 1k, 10k, 100k and 1M (the last step
// with --quick: 100k). Every cache has one small spec (1 layer, 1 kv head, head_dim 8,
// f16) and no tokens, so an idle cache holds no pages, only its bookkeeping; they are
// allocated by a few client threads, one Allocate RPC each, on their own channels. At
// each step, from one client thread, interleaved round by round:
//   - Reserve then Commit of one token on one of kActive caches (round robin), timed as
//     one sample (two RPCs; the caches were allocated first and keep growing);
//   - Stats of the whole arena (one pool);
//   - Ping, the empty RPC, as the control: a step whose Ping moved was disturbed by load;
//   - ListCaches' first page of 1000 (one call a round).
// and then reads the daemon's VmRSS (/proc/<pid>/status), Stats' metadata_bytes_used and
// the daemon's CPU time over a few seconds without calls (what its reaper costs).
// Bytes per idle cache = (RSS at N - RSS at 10) / (N - 10). Prints the command line, the
// CPU flags and one table; a full run takes a few minutes on two cores.
//
// Usage: scale_bench [--kvarenad=PATH] [--quick] [--threads=N] [--idle_ttl=D]
//   PATH defaults to ../daemon/kvarenad beside this binary (the build tree's layout);
//   N client threads allocate (default 4); D is passed to kvarenad as --idle_ttl (e.g.
//   1h: the reaper looks for idle caches but none expires during the run).
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/child_daemon.h"
#include "bench/daemon_channel.h"
#include "kvarena/v1/kvarena.grpc.pb.h"

namespace kvarena {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kActive = 8;
constexpr int64_t kMaxCaches = 1'000'000;
constexpr int kIdleSeconds = 3;  // how long each step watches the daemon's idle CPU

std::shared_ptr<grpc::Channel> Channel(const std::string& address, int tag) {
  grpc::ChannelArguments args;
  args.SetInt("kvarena.bench.channel", tag);  // a distinct channel (and connection) per tag
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

bool Check(const grpc::Status& s, const char* what) {
  if (!s.ok()) std::fprintf(stderr, "scale_bench: %s: %s\n", what, s.error_message().c_str());
  return s.ok();
}

std::string CacheId(int64_t i) { return "c" + std::to_string(i); }

v1::AllocateRequest AllocateRequestFor(int64_t i) {
  v1::AllocateRequest req;
  req.set_cache_id(CacheId(i));
  v1::CacheSpec* spec = req.mutable_spec();
  spec->set_num_layers(1);
  spec->set_num_kv_heads(1);
  spec->set_head_dim(8);
  spec->set_dtype(v1::FLOAT16);
  spec->set_page_size(16);
  return req;
}

// Allocates caches [from, to) from `threads` client threads, each on its own channel.
bool AllocateRange(const std::string& address, int64_t from, int64_t to, int threads) {
  std::atomic<int64_t> next{from};
  std::atomic<bool> ok{true};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      auto stub = v1::KvCacheService::NewStub(Channel(address, t));
      constexpr int64_t kBatch = 256;  // ids claimed at a time
      while (ok.load()) {
        const int64_t start = next.fetch_add(kBatch);
        if (start >= to) return;
        for (int64_t i = start; i < std::min(to, start + kBatch); ++i) {
          grpc::ClientContext ctx;
          v1::AllocateResponse resp;
          if (!Check(stub->Allocate(&ctx, AllocateRequestFor(i), &resp), "allocate")) {
            ok.store(false);
            return;
          }
        }
      }
    });
  }
  for (std::thread& w : workers) w.join();
  return ok.load();
}

// The CPU time the daemon has used (user + system, /proc/<pid>/stat), in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
  std::istringstream rest(text.substr(text.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i >= 14) ticks += std::atof(field.c_str());
  }
  return ticks / double(sysconf(_SC_CLK_TCK));
}

// The daemon's resident set in bytes (VmRSS), 0 if unreadable.
int64_t RssBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

std::string CpuFlags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) == 0) return line;
  }
  return "flags: (unknown)";
}

struct Samples {
  std::vector<double> us;
  double Quantile(double q) {
    if (us.empty()) return 0;
    std::sort(us.begin(), us.end());
    return us[std::min(us.size() - 1, size_t(double(us.size()) * q))];
  }
};

struct Step {
  int64_t caches = 0;
  double alloc_s = 0;
  Samples reserve_commit, stats, ping, list;
  int64_t rss = 0;
  double idle_cpu_ms_per_s = 0;  // the daemon's CPU while no client calls it
  uint64_t metadata_used = 0;
  uint64_t num_caches = 0;
};

// Times `op` n times after `warmup` untimed calls; false when a call failed.
bool Time(const std::function<bool()>& op, int n, Samples* out, int warmup = 5) {
  for (int i = -warmup; i < n; ++i) {
    const auto start = Clock::now();
    if (!op()) return false;
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (i >= 0) out->us.push_back(us);
  }
  return true;
}

bool Measure(v1::KvCacheService::Stub& stub, int rounds, Step* step) {
  int64_t turn = 0;
  const auto reserve_commit = [&] {
    v1::ReserveRequest reserve;
    v1::CommitRequest commit;
    const std::string id = CacheId(turn++ % kActive);
    reserve.add_items()->set_cache_id(id);
    reserve.mutable_items(0)->set_tokens(1);
    *commit.mutable_items() = reserve.items();
    v1::ReserveResponse reserved;
    v1::CommitResponse committed;
    grpc::ClientContext rctx, cctx;
    return Check(stub.Reserve(&rctx, reserve, &reserved), "reserve") &&
           Check(stub.Commit(&cctx, commit, &committed), "commit");
  };
  v1::StatsResponse stats;
  const auto whole_arena = [&] {
    grpc::ClientContext ctx;
    return Check(stub.Stats(&ctx, v1::StatsRequest(), &stats), "stats");
  };
  const auto ping = [&] {
    grpc::ClientContext ctx;
    v1::PingResponse resp;
    return Check(stub.Ping(&ctx, v1::PingRequest(), &resp), "ping");
  };
  v1::ListCachesRequest first_page;
  first_page.set_page_size(1000);
  const auto list = [&] {
    grpc::ClientContext ctx;
    v1::ListCachesResponse resp;
    return Check(stub.ListCaches(&ctx, first_page, &resp), "list_caches");
  };
  for (int r = 0; r < rounds; ++r) {
    if (!Time(reserve_commit, 100, &step->reserve_commit) || !Time(whole_arena, 50, &step->stats) ||
        !Time(ping, 50, &step->ping) || !Time(list, 1, &step->list, 0)) {
      return false;
    }
  }
  step->metadata_used = stats.metadata_bytes_used();
  step->num_caches = stats.num_caches();
  return true;
}

void PrintTable(std::vector<Step>& steps) {
  const double rc10 = steps.front().reserve_commit.Quantile(0.5);
  std::printf("%9s %8s %9s %9s %6s %7s %9s %9s %9s %9s %12s %10s %9s %8s\n", "caches", "alloc s",
              "R+C p50", "R+C p99", "vs 10", "/Ping", "Stats p50", "Ping p50", "RSS MiB", "B/cache",
              "metadata MiB", "meta B/c", "idle CPU", "List ms");
  const Step& base = steps.front();
  for (Step& s : steps) {
    const double rc = s.reserve_commit.Quantile(0.5);
    const int64_t idle = s.caches - base.caches;
    std::printf("%9lld %8.1f %9.1f %9.1f %6.2f %7.2f %9.1f %9.1f %9.1f", (long long)s.caches,
                s.alloc_s, rc, s.reserve_commit.Quantile(0.99), rc / rc10,
                rc / s.ping.Quantile(0.5), s.stats.Quantile(0.5), s.ping.Quantile(0.5),
                double(s.rss) / (1 << 20));
    if (idle > 0) {
      std::printf(" %9.0f %12.1f %10.0f", double(s.rss - base.rss) / double(idle),
                  double(s.metadata_used) / (1 << 20),
                  double(s.metadata_used - base.metadata_used) / double(idle));
    } else {
      std::printf(" %9s %12.1f %10s", "-", double(s.metadata_used) / (1 << 20), "-");
    }
    std::printf(" %9.1f %8.2f\n", s.idle_cpu_ms_per_s, s.list.Quantile(0.5) / 1e3);
  }
  std::printf(
      "(R+C: Reserve then Commit of 1 token, two RPCs, on %d active caches; us. /Ping: "
      "R+C p50 over the same step's Ping p50. B/cache: RSS growth per idle cache since "
      "the first row. idle CPU: the daemon's ms of CPU per second over %ds without calls. List: "
      "p50 of ListCaches' first page of 1000.)\n",
      kActive, kIdleSeconds);
}

int Run(const std::string& kvarenad, bool quick, int threads, const std::string& idle_ttl) {
  const int64_t last = quick ? 100'000 : kMaxCaches;
  std::vector<int64_t> sizes = {10, 1'000, 10'000, 100'000, 1'000'000};
  sizes.erase(std::remove_if(sizes.begin(), sizes.end(), [&](int64_t n) { return n > last; }),
              sizes.end());
  char dir_template[] = "/tmp/kvarena_scale_bench.XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  std::vector<Step> steps;
  {
    const std::string cap = std::to_string(last + 100);
    std::vector<std::string> flags = {"--backend=host", "--arena_bytes=256Mi",
                                      "--metadata_bytes=8Gi", "--max_caches=" + cap,
                                      "--max_caches_per_session=" + cap};
    if (!idle_ttl.empty()) flags.push_back("--idle_ttl=" + idle_ttl);
    ChildDaemon daemon(kvarenad, dir, flags);
    const std::shared_ptr<grpc::Channel> channel =
        daemon.ok() ? ConnectToDaemon(daemon.address()) : nullptr;
    if (channel == nullptr) {
      std::fprintf(stderr, "scale_bench: could not start or reach %s (log in %s)\n",
                   kvarenad.c_str(), dir.c_str());
      return 1;
    }
    int64_t live = 0;
    for (int64_t n : sizes) {
      Step step;
      step.caches = n;
      const auto start = Clock::now();
      if (!AllocateRange(daemon.address(), live, n, live == 0 ? 1 : threads)) return 1;
      step.alloc_s = std::chrono::duration<double>(Clock::now() - start).count();
      live = n;
      if (!Measure(*v1::KvCacheService::NewStub(channel), quick ? 10 : 40, &step)) return 1;
      step.rss = RssBytes(daemon.pid());
      const double cpu_before = CpuSeconds(daemon.pid());
      std::this_thread::sleep_for(std::chrono::seconds(kIdleSeconds));
      step.idle_cpu_ms_per_s = (CpuSeconds(daemon.pid()) - cpu_before) * 1e3 / kIdleSeconds;
      if (step.num_caches != uint64_t(n)) {
        std::fprintf(stderr, "scale_bench: Stats counts %llu caches, expected %lld\n",
                     (unsigned long long)step.num_caches, (long long)n);
        return 1;
      }
      std::fprintf(stderr, "scale_bench: %lld caches measured\n", (long long)n);
      steps.push_back(std::move(step));
    }
  }
  std::filesystem::remove_all(dir);
  std::printf("%s\n", CpuFlags().c_str());
  std::printf("scale_bench: %u cores, %d allocating threads\n", std::thread::hardware_concurrency(),
              threads);
  PrintTable(steps);
  return 0;
}

}  // namespace
}  // namespace kvarena

int main(int argc, char** argv) {
  std::string kvarenad = kvarena::DefaultKvarenadPath();
  bool quick = false;
  int threads = 4;
  std::string idle_ttl;
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--kvarenad=", 0) == 0) {
      kvarenad = arg.substr(11);
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg.rfind("--idle_ttl=", 0) == 0) {
      idle_ttl = arg.substr(11);
    } else if (arg.rfind("--threads=", 0) == 0 && std::atoi(arg.c_str() + 10) > 0) {
      threads = std::atoi(arg.c_str() + 10);
    } else {
      std::fprintf(stderr, "usage: %s [--kvarenad=PATH] [--quick] [--threads=N] [--idle_ttl=D]\n",
                   argv[0]);
      return 2;
    }
  }
  std::printf("$ %s\n", command.c_str());
  std::fflush(stdout);
  return kvarena::Run(kvarenad, quick, threads, idle_ttl);
}
