// A shared-prefix serving workload with and without prefix reuse (docs/prefix-reuse.md).
// --workers processes (4) each run --requests requests (8) one after another against one
// kvarenad. A request is a --system-token system prompt every request shares (2048), a
// --suffix-token suffix unique to the request (128) and --decode generated tokens (32),
// each declared with SetTokens. The "model" is attention alone, on the served path: per
// layer one Attend RPC (q, k, v) over the positions Allocate did not adopt, then one per
// layer per decode step. The same workload runs twice in one invocation, each time on a
// fresh kvarenad: with reuse (prefix_namespace "bench") and without (namespace "": nothing
// is shared).
//
// Reported per mode: prefill positions computed (summed over requests), time to first
// token p50 / p99 (from Allocate to the last prompt position's output on the last layer,
// per request), total wall time, and the peak of the arena's pages in use (distinct pages
// caches reference; Stats sampled every 5 ms by this process), over the run and once every
// worker finished its first request. The workers start together, so with reuse their first
// requests all miss (none has registered the system prompt yet): they set the p99 and the
// run's peak; the later ones adopt the 2048 shared positions.
//
// Usage: prefix_bench [--kvarenad=PATH] [--workers=N] [--requests=N] [--system=N]
//                     [--suffix=N] [--decode=N] [--layers=N] [--quick]
// A worker is this binary re-run with --worker=ADDRESS.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bench/child_daemon.h"
#include "bench/prefix_workload.h"

namespace kvarena {
namespace {

// One worker process: prints "request R cached C computed N ttft_ms T" per request.
int RunWorker(const std::string& address, const std::string& prefix_namespace, int id,
              const Workload& w) {
  ClientOptions options;
  options.client_name = "prefix_bench_worker";
  auto client = Client::Connect(address, options);
  if (!client.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", id, client.status().ToString().c_str());
    return 1;
  }
  const CacheSpec spec = WorkloadSpec(w, prefix_namespace);
  const Noise noise(w, w.system + w.suffix, uint32_t(1000 + id));
  for (int r = 0; r < w.requests; ++r) {
    auto first =
        TimeFirstToken(**client, spec, WorkloadPrompt(w, 0, id * w.requests + r), w, noise);
    if (!first.ok()) {
      std::fprintf(stderr, "worker %d: %s\n", id, first.status().ToString().c_str());
      return 1;
    }
    absl::Status s;
    const int64_t prompt_len = first->cached + first->computed;
    for (int t = 0; s.ok() && t < w.decode; ++t) {
      s = first->cache->set_tokens(prompt_len + t, {int32_t(900000 + t)});
      if (s.ok()) s = Compute(*first->cache, w, 1, noise);
    }
    if (s.ok()) s = first->cache->release();
    if (!s.ok()) {
      std::fprintf(stderr, "worker %d request %d: %s\n", id, r, s.ToString().c_str());
      return 1;
    }
    std::printf("request %d cached %lld computed %lld ttft_ms %.3f\n", r,
                static_cast<long long>(first->cached), static_cast<long long>(first->computed),
                first->ttft_ms);
    std::fflush(stdout);
  }
  return 0;
}

struct ModeResult {
  int64_t computed = 0, cached = 0;
  std::vector<double> ttft_ms;
  double total_s = 0;
  int64_t peak_pages = 0;       // over the whole run
  int64_t peak_pages_warm = 0;  // once every worker finished its first request
  bool ok = false;
};

// Runs the workload's worker processes against a fresh kvarenad.
ModeResult RunMode(const std::string& kvarenad, const std::string& self,
                   const std::string& prefix_namespace, const Workload& w,
                   const std::vector<std::string>& pass_through) {
  ModeResult result;
  char dir_template[] = "/tmp/kvarena_prefix_bench.XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  ChildDaemon daemon(kvarenad, dir, {"--arena_bytes=2Gi", "--num_threads=2"});
  std::shared_ptr<Client> observer =
      daemon.ok() ? ConnectWhenUp(daemon.address(), "prefix_bench") : nullptr;
  if (observer == nullptr) {
    std::fprintf(stderr, "prefix_bench: could not start or reach %s (log in %s)\n",
                 kvarenad.c_str(), dir.c_str());
    return result;
  }
  std::atomic<bool> done{false};
  std::atomic<int> warm_workers{0};  // workers past their first request
  std::atomic<int64_t> peak{0}, peak_warm{0};
  std::thread sampler([&] {
    while (!done.load()) {
      const bool warm = warm_workers.load() == w.workers;
      if (auto st = observer->Stats(); st.ok()) {
        const int64_t used = int64_t(st->pages.pages_used);
        peak = std::max(peak.load(), used);
        if (warm) peak_warm = std::max(peak_warm.load(), used);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  const auto start = Clock::now();
  std::vector<std::pair<pid_t, FILE*>> workers;
  for (int id = 0; id < w.workers; ++id) {
    int fds[2];
    if (pipe(fds) != 0) break;
    std::vector<std::string> argv = {self, "--worker=" + daemon.address(),
                                     "--namespace=" + prefix_namespace,
                                     "--id=" + std::to_string(id)};
    argv.insert(argv.end(), pass_through.begin(), pass_through.end());
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    workers.emplace_back(pid, fdopen(fds[0], "r"));
  }
  result.ok = int(workers.size()) == w.workers;
  std::vector<ModeResult> per_worker(workers.size());
  std::vector<std::thread> readers;
  for (size_t i = 0; i < workers.size(); ++i) {  // a reader each: none waits on another's pipe
    readers.emplace_back([&, i] {
      ModeResult& mine = per_worker[i];
      char line[256];
      while (std::fgets(line, sizeof line, workers[i].second) != nullptr) {
        int r = 0;
        long long cached = 0, computed = 0;
        double ttft = 0;
        if (std::sscanf(line, "request %d cached %lld computed %lld ttft_ms %lf", &r, &cached,
                        &computed, &ttft) != 4) {
          continue;
        }
        if (mine.ttft_ms.empty()) ++warm_workers;
        mine.cached += cached;
        mine.computed += computed;
        mine.ttft_ms.push_back(ttft);
      }
      std::fclose(workers[i].second);
      int status = 0;
      waitpid(workers[i].first, &status, 0);
      mine.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    });
  }
  for (std::thread& t : readers) t.join();
  for (const ModeResult& mine : per_worker) {
    result.ok = result.ok && mine.ok;
    result.cached += mine.cached;
    result.computed += mine.computed;
    result.ttft_ms.insert(result.ttft_ms.end(), mine.ttft_ms.begin(), mine.ttft_ms.end());
  }
  result.total_s = Ms(start) / 1000.0;
  done = true;
  sampler.join();
  result.peak_pages = peak.load();
  result.peak_pages_warm = peak_warm.load();
  result.ok = result.ok && int(result.ttft_ms.size()) == w.workers * w.requests;
  return result;
}

int Run(const std::string& kvarenad, const Workload& w,
        const std::vector<std::string>& pass_through) {
  const std::string self = std::filesystem::canonical("/proc/self/exe").string();
  std::printf(
      "prefix_bench: %d workers x %d requests: %d shared + %d unique prompt tokens, %d decoded; "
      "%d layers, %d kv heads, %d q heads, head_dim %d, float32, page %d; served path, kvarenad "
      "--num_threads=2\n",
      w.workers, w.requests, w.system, w.suffix, w.decode, w.layers, w.kv_heads, w.q_heads,
      w.head_dim, w.page_size);
  std::printf(
      "| mode | prefill positions computed | adopted | TTFT p50 (ms) | TTFT p99 (ms) | total (s) | "
      "peak pages in use | after the first requests |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::map<std::string, ModeResult> results;
  for (const auto& [mode, ns] :
       {std::pair<std::string, std::string>{"no reuse", ""}, {"prefix reuse", "bench"}}) {
    ModeResult r = RunMode(kvarenad, self, ns, w, pass_through);
    if (!r.ok) {
      std::fprintf(stderr, "prefix_bench: mode %s failed\n", mode.c_str());
      return 1;
    }
    std::printf("| %s | %lld | %lld | %.1f | %.1f | %.2f | %lld | %lld |\n", mode.c_str(),
                static_cast<long long>(r.computed), static_cast<long long>(r.cached),
                Percentile(r.ttft_ms, 50), Percentile(r.ttft_ms, 99), r.total_s,
                static_cast<long long>(r.peak_pages), static_cast<long long>(r.peak_pages_warm));
    std::fflush(stdout);
    results[mode] = std::move(r);
  }
  const ModeResult& a = results["no reuse"];
  const ModeResult& b = results["prefix reuse"];
  std::printf(
      "reuse/no reuse: computed %.3f, TTFT p50 %.3f, p99 %.3f, total %.3f, peak pages %.3f (%.3f "
      "after "
      "the first requests)\n",
      double(b.computed) / double(a.computed),
      Percentile(b.ttft_ms, 50) / Percentile(a.ttft_ms, 50),
      Percentile(b.ttft_ms, 99) / Percentile(a.ttft_ms, 99), b.total_s / a.total_s,
      double(b.peak_pages) / double(a.peak_pages),
      double(b.peak_pages_warm) / double(std::max<int64_t>(1, a.peak_pages_warm)));
  return 0;
}

}  // namespace
}  // namespace kvarena

int main(int argc, char** argv) {
  kvarena::Workload w;
  std::string kvarenad = kvarena::DefaultKvarenadPath(), worker, prefix_namespace;
  int id = 0;
  std::vector<std::string> pass_through;  // the workload flags, for the workers
  auto int_flag = [&](const std::string& arg, const char* name, int* out) {
    const std::string prefix = std::string("--") + name + "=";
    if (arg.rfind(prefix, 0) != 0) return false;
    *out = std::max(1, std::atoi(arg.c_str() + prefix.size()));
    return true;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    bool workload = int_flag(arg, "workers", &w.workers) ||
                    int_flag(arg, "requests", &w.requests) || int_flag(arg, "system", &w.system) ||
                    int_flag(arg, "suffix", &w.suffix) || int_flag(arg, "decode", &w.decode) ||
                    int_flag(arg, "layers", &w.layers);
    if (arg == "--quick") {
      w.requests = 2;
      w.system = 512;
      w.suffix = 32;
      w.decode = 8;
      workload = true;
    }
    if (workload) {
      pass_through.push_back(arg);
    } else if (arg.rfind("--kvarenad=", 0) == 0) {
      kvarenad = arg.substr(11);
    } else if (arg.rfind("--worker=", 0) == 0) {
      worker = arg.substr(9);
    } else if (arg.rfind("--namespace=", 0) == 0) {
      prefix_namespace = arg.substr(12);
    } else if (arg.rfind("--id=", 0) == 0) {
      id = std::atoi(arg.c_str() + 5);
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--kvarenad=PATH] [--workers=N] [--requests=N] [--system=N] [--suffix=N] "
          "[--decode=N] [--layers=N] [--quick]\n",
          argv[0]);
      return 2;
    }
  }
  if (!worker.empty()) return kvarena::RunWorker(worker, prefix_namespace, id, w);
  return kvarena::Run(kvarenad, w, pass_through);
}
