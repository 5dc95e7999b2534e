// One decode loop, four ways, in one run (DESIGN.md "Two data paths, one arena": the
// local path should come within a few percent of an in-process paged cache):
//   (a) in-process paged cache: a KvStore used directly, Attend with k/v per layer per cache;
//   (b) local path against a kvarenad child: Client::Reserve (ahead: one RPC per page
//       boundary for the batch), attention_local per layer per cache over the mapped pool,
//       Client::Commit per step;
//   (c) served path against the same kvarenad: an Attend RPC per layer per cache, q/k/v/out
//       through the session's scratch region (shared slices);
//   (d) batched local path against the same kvarenad: a DecodeBatch (kvarena/decode_batch.h)
//       Plan per step, one Run per layer for all caches (append + attention over the mapped
//       pool, the CPU kernels' threads spread over the batch), one Commit per step.
// Shape: 32 layers, 8 kv heads, 32 q heads, head_dim 128, float16, page 16, a batch of 8
// caches, context 2048 growing by --steps (128) tokens. Each way has its own caches,
// prefilled the same cheap way (one bulk K/V write per layer); the decode runs in rounds
// that alternate the four ways (each round starting with the next) so load that comes
// and goes weighs on each alike.
// The ways themselves are in bench/decode_loop_ways.h; this file times and prints them.
// Prints tokens/s (batch tokens per second of decode) and the ratios b/a, c/a and d/a, and
// what each of (c)'s Attend RPCs adds over (a)'s in-process call, also in empty RPCs
// (Pings on the same daemon, timed after every round).
//
// Usage: decode_loop_bench [--kvarenad=PATH] [--steps=N] [--rounds=R] [--quick]
//                          [--cpu_pool_awake_us=U]
//   PATH defaults to ../daemon/kvarenad beside this binary (the build tree's layout); U:
//   how long idle CPU attention workers stay awake in the daemon and in (a) (kvarenad's
//   --cpu_pool_awake; default its default). The local ways' kernels keep the default.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench/child_daemon.h"
#include "bench/daemon_channel.h"
#include "bench/decode_loop_ways.h"
#include "bench/pool_awake.h"
#include "kvarena/client.h"

namespace kvarena::decode_loop {
namespace {

constexpr int kPingsPerRound = 200;
using Clock = std::chrono::steady_clock;

std::shared_ptr<Client> ConnectWithRetry(const std::string& address) {
  for (int attempt = 0; attempt < 250; ++attempt) {
    ClientOptions options;
    options.client_name = "decode_loop_bench";
    options.connect_timeout = absl::Seconds(1);
    if (auto c = Client::Connect(address, options); c.ok()) return *c;
    usleep(20'000);
  }
  return nullptr;
}

int Run(const std::string& kvarenad, int steps, int rounds, const PoolAwake& awake) {
  char dir_template[] = "/tmp/kvarena_decode_bench.XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  std::vector<std::string> flags = {"--arena_bytes=8Gi", "--page_size=16"};
  awake.AddTo(&flags);
  ChildDaemon daemon(kvarenad, dir, flags);
  std::shared_ptr<Client> client = daemon.ok() ? ConnectWithRetry(daemon.address()) : nullptr;
  if (client == nullptr) {
    std::fprintf(stderr, "decode_loop_bench: could not start or reach %s (log in %s)\n",
                 kvarenad.c_str(), dir.c_str());
    return 1;
  }
  InProcess a;
  ThroughDaemon b(client, /*local=*/true), c(client, /*local=*/false);
  Batched d(client);
  if (!a.Init(awake) || !b.Init() || !c.Init() || !d.Init()) return 1;

  std::mt19937 rng(1);
  const Half prefill_k(kKvHeads, kContext, &rng), prefill_v(kKvHeads, kContext, &rng);
  std::vector<StepTensors> tensors;
  for (int i = 0; i < kTensorSets; ++i) tensors.emplace_back(&rng);
  d.SetTensors(tensors);
  Way* const ways[] = {&a, &b, &c, &d};
  constexpr int kWays = 4;
  for (Way* w : ways) {
    if (!w->Prefill(prefill_k, prefill_v)) return 1;
  }
  CallCounts calls_before = client->call_counts(), calls_b, calls_d;
  auto add = [](CallCounts* sum, const CallCounts& from, const CallCounts& to) {
    sum->reserve += to.reserve - from.reserve;
    sum->commit += to.commit - from.commit;
    sum->describe += to.describe - from.describe;
  };
  // Pings on a channel of their own, timed after every round: the unit of (c)'s excess.
  const std::shared_ptr<grpc::Channel> ping_channel = ConnectToDaemon(daemon.address());
  if (ping_channel == nullptr) return 1;
  const std::unique_ptr<v1::KvCacheService::Stub> ping_stub =
      v1::KvCacheService::NewStub(ping_channel);
  std::vector<double> ping_us;
  const int per_round = (steps + rounds - 1) / rounds;
  for (int done = 0, round = 0; done < steps; ++round) {
    const int n = std::min(per_round, steps - done);
    for (int i = 0; i < kWays; ++i) {  // each round starts with the next way
      Way* w = ways[(round + i) % kWays];
      calls_before = client->call_counts();
      const auto start = Clock::now();
      for (int s = 0; s < n; ++s) {
        if (!w->Step(tensors)) return 1;
      }
      w->seconds += std::chrono::duration<double>(Clock::now() - start).count();
      w->steps += n;
      if (w == &b) add(&calls_b, calls_before, client->call_counts());
      if (w == &d) add(&calls_d, calls_before, client->call_counts());
    }
    for (int i = 0; i < kPingsPerRound; ++i) {
      grpc::ClientContext ctx;
      v1::PingResponse pong;
      const auto start = Clock::now();
      if (!ping_stub->Ping(&ctx, v1::PingRequest(), &pong).ok()) return 1;
      ping_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    }
    done += n;
  }

  std::printf(
      "decode_loop_bench: %d layers, %d kv heads, %d q heads, head_dim %d, float16, page %d, "
      "batch %d, context %d -> %d, %u cores\n",
      kLayers, kKvHeads, kQHeads, kHeadDim, kPageSize, kBatch, kContext, kContext + steps,
      std::thread::hardware_concurrency());
  const double base = kBatch * a.steps / a.seconds;
  std::printf("%-58s %10s %9s %8s\n", "way", "tokens/s", "ms/step", "vs (a)");
  const struct {
    const char* name;
    const Way* w;
    const char* ratio;
  } rows[] = {{"(a) in-process KvStore, Attend per layer per cache", &a, ""},
              {"(b) local path: Reserve ahead + attention_local + Commit", &b, "b/a"},
              {"(c) served path: Attend RPC per layer per cache (shared)", &c, "c/a"},
              {"(d) batched local path: DecodeBatch Plan + Run per layer", &d, "d/a"}};
  for (const auto& r : rows) {
    const double tps = kBatch * r.w->steps / r.w->seconds;
    std::printf("%-58s %10.1f %9.2f %4s %.3f\n", r.name, tps, 1000 * r.w->seconds / r.w->steps,
                r.ratio, tps / base);
  }
  for (const auto& [name, w, calls] :
       {std::tuple<const char*, const Way*, CallCounts>{"(b)", &b, calls_b},
        {"(d)", &d, calls_d}}) {
    std::printf("%s per step: %.3f Reserve RPCs, %.3f Commit RPCs, %lld Describe in all\n", name,
                double(calls.reserve) / w->steps, double(calls.commit) / w->steps,
                static_cast<long long>(calls.describe));
  }
  std::printf("(c) per step: %d Attend RPCs; (d) per step: %d kernel calls (b: %d)\n",
              kLayers * kBatch, 2 * kLayers, 2 * kLayers * kBatch);
  std::sort(ping_us.begin(), ping_us.end());
  const double ping = ping_us[ping_us.size() / 2];
  const double adds = 1e6 * (c.seconds / c.steps - a.seconds / a.steps) / (kLayers * kBatch);
  std::printf(
      "(c) adds %.1f us per Attend RPC over (a)'s call: %.2f Pings (Ping p50 %.1f us, %d after "
      "each round)\n",
      adds, adds / ping, ping, kPingsPerRound);
  client.reset();
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace kvarena::decode_loop

int main(int argc, char** argv) {
  std::string kvarenad = kvarena::DefaultKvarenadPath();
  int steps = 128, rounds = 4;
  kvarena::PoolAwake awake;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (awake.Parse(arg)) continue;
    if (arg.rfind("--kvarenad=", 0) == 0) {
      kvarenad = arg.substr(11);
    } else if (arg.rfind("--steps=", 0) == 0) {
      steps = std::max(1, std::atoi(arg.c_str() + 8));
    } else if (arg.rfind("--rounds=", 0) == 0) {
      rounds = std::max(1, std::atoi(arg.c_str() + 9));
    } else if (arg == "--quick") {
      steps = 16;
      rounds = 2;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--kvarenad=PATH] [--steps=N] [--rounds=R] [--quick] "
                   "[--cpu_pool_awake_us=U]\n",
                   argv[0]);
      return 2;
    }
  }
  return kvarena::decode_loop::Run(kvarenad, steps, rounds, awake);
}
