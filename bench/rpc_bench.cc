// RPC latency over a Unix socket: starts the real kvarenad as a child process and times,
// from one client thread, grpc.health.v1.Health/Check (gRPC's own empty-ish unary call on
// the same server), Ping (the empty unary RPC), Append of one decode token, Popn(1) after
// an untimed Append, Health/Check after the same untimed Append (Popn's like-for-like
// baseline), Stats over a dozen pools and a decode Attend over a 4096-token context; every row's
// p50 is given against both Health/Check and Ping. The same core operations are timed in process (a
// KvStore here) so the table shows what the RPC adds, also in empty RPCs (Pings). Two rows time
// a hand-off (bench/handoff.h) instead of an RPC, an empty one and the 4k decode Attend: what
// serving from another thread costs with no gRPC at all, two thread wake-ups. Plain loops with
// std::chrono, every operation interleaved round by round; prints one table; runs in well under 2
// minutes.
//
// Usage: rpc_bench [--kvarenad=PATH] [--quick] [--num_threads=N] [--cpu_pool_awake_us=U]
//   N: CPU attention threads of the daemon and of the in-process store alike (default -1:
//   one per core); U: how long their idle workers stay awake (--cpu_pool_awake; default
//   the daemon's).
//   PATH defaults to ../daemon/kvarenad beside this binary (the build tree's layout).
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/child_daemon.h"
#include "bench/daemon_channel.h"
#include "bench/half_tensor.h"
#include "bench/handoff.h"
#include "bench/pool_awake.h"
#include "core/kv_store.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvarena/v1/kvarena.grpc.pb.h"

namespace kvarena {
namespace {

constexpr int kKvHeads = 8, kQHeads = 32, kHeadDim = 128, kContext = 4096;
// Caches of this many distinct specs (head_dim 8, 16, ...) besides the bench's own, so
// Stats reports a dozen pools.
constexpr int kExtraPools = 11;

TensorArg Arg(const v1::Tensor& t) {
  return {DType::kFloat16, {t.shape().begin(), t.shape().end()}, t.data().data(), t.data().size()};
}

struct Latency {
  double p50 = 0, p99 = 0;
  int n = 0;
};

// One timed operation: `op` runs n times; `between` (optional) runs untimed before each.
struct Timed {
  Timed(std::function<bool()> op, std::function<void()> between, int n)
      : op(std::move(op)), between(std::move(between)), n(n) {}

  std::function<bool()> op;
  std::function<void()> between;
  int n;
  std::vector<double> us;

  Latency Result() {
    if (us.empty()) return {};
    std::sort(us.begin(), us.end());
    return {us[us.size() / 2], us[std::min(us.size() - 1, size_t(us.size() * 0.99))],
            int(us.size())};
  }
};

// Runs every operation in kRounds interleaved rounds (a few untimed warm-up calls each),
// so load that comes and goes on the machine weighs on every row alike.
void MeasureInterleaved(const std::vector<Timed*>& ops) {
  using Clock = std::chrono::steady_clock;
  constexpr int kRounds = 10, kWarmup = 5;
  for (int round = 0; round < kRounds; ++round) {
    for (Timed* t : ops) {
      const int n = t->n / kRounds;
      for (int i = -kWarmup; i < n; ++i) {
        if (t->between) t->between();
        const auto start = Clock::now();
        const bool ok = t->op();
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
        if (!ok) {
          std::fprintf(stderr, "rpc_bench: call failed\n");
          std::exit(1);
        }
        if (i >= 0) t->us.push_back(us);
      }
    }
  }
}

struct Row {
  const char* name;
  Latency rpc;
  Latency local;  // n == 0: no in-process counterpart
};

// rows[0] is Health/Check, rows[1] Ping.
void PrintTable(const std::vector<Row>& rows) {
  const double health = rows[0].rpc.p50, ping = rows[1].rpc.p50;
  std::printf("%-34s %6s %9s %9s %8s %8s %11s %9s %9s\n", "operation (UDS, 1 client)", "n",
              "p50 us", "p99 us", "/Health", "/Ping", "in-proc p50", "RPC adds", "in Pings");
  for (const Row& r : rows) {
    std::printf("%-34s %6d %9.1f %9.1f %8.2f %8.2f", r.name, r.rpc.n, r.rpc.p50, r.rpc.p99,
                r.rpc.p50 / health, r.rpc.p50 / ping);
    if (r.local.n > 0) {
      const double adds = r.rpc.p50 - r.local.p50;
      std::printf(" %11.1f %9.1f %9.2f\n", r.local.p50, adds, adds / ping);
    } else {
      std::printf(" %11s %9s %9s\n", "-", "-", "-");
    }
  }
}

int Run(const std::string& kvarenad, bool quick, int num_threads, const PoolAwake& awake) {
  const int scale = quick ? 10 : 1;
  char dir_template[] = "/tmp/kvarena_rpc_bench.XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  std::vector<Row> rows;
  double popn_vs_health_after = 0;
  {
    std::vector<std::string> flags = {"--arena_bytes=1Gi",
                                      "--num_threads=" + std::to_string(num_threads)};
    awake.AddTo(&flags);
    ChildDaemon daemon(kvarenad, dir, flags);
    const std::shared_ptr<grpc::Channel> daemon_channel =
        daemon.ok() ? ConnectToDaemon(daemon.address()) : nullptr;
    if (daemon_channel == nullptr) {
      std::fprintf(stderr, "rpc_bench: could not start or reach %s (log in %s)\n", kvarenad.c_str(),
                   dir.c_str());
      return 1;
    }
    const std::unique_ptr<v1::KvCacheService::Stub> stub =
        v1::KvCacheService::NewStub(daemon_channel);
    StoreOptions local_options;
    local_options.num_threads = num_threads;
    awake.ApplyTo(&local_options);
    std::unique_ptr<KvStore> store = *KvStore::Create(local_options, NewHostBackend());
    std::mt19937 rng(1);
    const auto call = [&](auto method, const auto& req, auto* resp) {
      grpc::ClientContext ctx;
      return ((*stub).*method)(&ctx, req, resp).ok();
    };

    // Two caches of one layer [8 kv heads, head_dim 128, float16]: one for appends, one
    // prefilled with the decode context. Each exists in the daemon and in process.
    v1::AllocateRequest alloc;
    alloc.mutable_spec()->set_num_layers(1);
    alloc.mutable_spec()->set_num_kv_heads(kKvHeads);
    alloc.mutable_spec()->set_head_dim(kHeadDim);
    alloc.mutable_spec()->set_dtype(v1::FLOAT16);
    const CacheSpec spec{1, kKvHeads, kHeadDim, DType::kFloat16, 16, {}, 0, ""};
    v1::AllocateResponse allocated;
    for (const char* id : {"append", "context"}) {
      alloc.set_cache_id(id);
      if (!call(&v1::KvCacheService::Stub::Allocate, alloc, &allocated) ||
          !store->Allocate("", spec, id).ok()) {
        std::fprintf(stderr, "rpc_bench: allocate failed\n");
        return 1;
      }
    }
    for (int i = 1; i <= kExtraPools; ++i) {
      const std::string id = "pool" + std::to_string(i);
      CacheSpec extra = spec;
      extra.head_dim = 8 * i;
      alloc.set_cache_id(id);
      alloc.mutable_spec()->set_head_dim(uint32_t(extra.head_dim));
      if (!call(&v1::KvCacheService::Stub::Allocate, alloc, &allocated) ||
          !store->Allocate("", extra, id).ok()) {
        std::fprintf(stderr, "rpc_bench: allocate failed\n");
        return 1;
      }
    }
    v1::AppendRequest prefill;
    prefill.set_cache_id("context");
    for (int pos = 0; pos < kContext; pos += 512) {
      prefill.set_pos(pos);
      *prefill.mutable_k() = HalfTensor(kKvHeads, 512, kHeadDim, &rng);
      *prefill.mutable_v() = HalfTensor(kKvHeads, 512, kHeadDim, &rng);
      v1::AppendResponse r;
      if (!call(&v1::KvCacheService::Stub::Append, prefill, &r) ||
          !store->Append("", "context", 0, pos, Arg(prefill.k()), Arg(prefill.v())).ok()) {
        std::fprintf(stderr, "rpc_bench: prefill failed\n");
        return 1;
      }
    }

    // The operations, over the daemon (rpc) and in process (local).
    std::unique_ptr<grpc::health::v1::Health::Stub> health_stub =
        grpc::health::v1::Health::NewStub(daemon_channel);
    grpc::health::v1::HealthCheckResponse served;
    Timed health{
        [&] {
          grpc::ClientContext ctx;
          return health_stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &served).ok();
        },
        nullptr, 20000 / scale};
    v1::PingResponse pong;
    Timed ping{[&] { return call(&v1::KvCacheService::Stub::Ping, v1::PingRequest(), &pong); },
               nullptr, 20000 / scale};

    v1::AppendRequest append;
    append.set_cache_id("append");
    *append.mutable_k() = HalfTensor(kKvHeads, 1, kHeadDim, &rng);
    *append.mutable_v() = HalfTensor(kKvHeads, 1, kHeadDim, &rng);
    v1::AppendResponse appended;
    uint64_t rpc_pos = 0;
    int64_t local_pos = 0;
    const TensorArg k1 = Arg(append.k()), v1_ = Arg(append.v());
    const auto rpc_append = [&] {
      append.set_pos(rpc_pos++);
      return call(&v1::KvCacheService::Stub::Append, append, &appended);
    };
    const auto local_append = [&] {
      return store->Append("", "append", 0, local_pos++, k1, v1_).ok();
    };
    Timed append_rpc{rpc_append, nullptr, 5000 / scale};
    Timed append_local{local_append, nullptr, 5000 / scale};

    v1::PopnRequest popn;
    popn.set_cache_id("append");
    popn.set_n(1);
    v1::PopnResponse popped;
    Timed popn_rpc{[&] {
                     --rpc_pos;
                     return call(&v1::KvCacheService::Stub::Popn, popn, &popped) &&
                            popped.popped() == 1;
                   },
                   [&] { rpc_append(); }, 5000 / scale};
    Timed popn_local{[&] {
                       --local_pos;
                       auto r = store->Popn("", "append", 1);
                       return r.ok() && r->popped == 1;
                     },
                     [&] { local_append(); }, 5000 / scale};

    // Popn's like-for-like baseline: Health/Check after the same untimed Append (popped again,
    // untimed, before the next one), so both calls follow an Append whose tail on the
    // daemon's threads (the reply's flush, the next call's request slot) competes with them.
    bool appended_for_health = false;
    Timed health_after_append{
        [&] {
          grpc::ClientContext ctx;
          return health_stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &served).ok();
        },
        [&] {
          if (appended_for_health) {
            --rpc_pos;
            call(&v1::KvCacheService::Stub::Popn, popn, &popped);
          }
          appended_for_health = rpc_append();
        },
        5000 / scale};

    v1::StatsResponse stats;
    Timed stats_rpc{
        [&] { return call(&v1::KvCacheService::Stub::Stats, v1::StatsRequest(), &stats); }, nullptr,
        20000 / scale};
    Timed stats_local{[&] { return store->Stats().num_caches == 2 + kExtraPools; }, nullptr,
                      20000 / scale};

    v1::AttendRequest attend;
    attend.set_cache_id("context");
    attend.set_pos(kContext - 1);
    *attend.mutable_q() = HalfTensor(kQHeads, 1, kHeadDim, &rng);
    v1::AttendResponse attended;
    AttendArgs args;
    args.cache_id = "context";
    args.pos = kContext - 1;
    args.q = Arg(attend.q());
    std::string out(args.q.bytes, '\0');
    Timed attend_rpc{[&] { return call(&v1::KvCacheService::Stub::Attend, attend, &attended); },
                     nullptr, 1000 / scale};
    Timed attend_local{[&] { return store->Attend("", args, out.data(), out.size()).ok(); },
                       nullptr, 1000 / scale};
    // The served call's floor: the same in-process call run by another thread, woken over a
    // socket pair and waking this one back — two thread wake-ups and no gRPC — beside the
    // same hand-off with no work (which the gap after a long call can make dearer).
    Handoff empty_thread([] { return true; });
    Handoff attend_thread([&] { return store->Attend("", args, out.data(), out.size()).ok(); });
    Timed handoff_empty{[&] { return empty_thread.Call(); }, nullptr, 20000 / scale};
    Timed attend_handoff{[&] { return attend_thread.Call(); }, nullptr, 1000 / scale};

    // The same call at position 0 (one key): the 8 KB in and 8 KB out with next to no
    // kernel, so what carrying them costs shows apart from the kernel's time.
    v1::AttendRequest attend_first = attend;
    attend_first.set_pos(0);
    AttendArgs first_args = args;
    first_args.pos = 0;
    Timed attend_first_rpc{
        [&] { return call(&v1::KvCacheService::Stub::Attend, attend_first, &attended); }, nullptr,
        5000 / scale};
    Timed attend_first_local{
        [&] { return store->Attend("", first_args, out.data(), out.size()).ok(); }, nullptr,
        5000 / scale};

    MeasureInterleaved({&health, &ping, &handoff_empty, &append_rpc, &append_local,
                        &health_after_append, &popn_rpc, &popn_local, &stats_rpc, &stats_local,
                        &attend_rpc, &attend_local, &attend_handoff, &attend_first_rpc,
                        &attend_first_local});
    rows = {{"Health/Check (gRPC's own)", health.Result(), {}},
            {"Ping (empty unary)", ping.Result(), {}},
            {"Hand-off to a thread (no gRPC)", handoff_empty.Result(), {}},
            {"Append (1 token, 8x128 f16)", append_rpc.Result(), append_local.Result()},
            {"Health/Check (after an append)", health_after_append.Result(), {}},
            {"Popn(1) (after an untimed append)", popn_rpc.Result(), popn_local.Result()},
            {"Stats (whole arena, 12 pools)", stats_rpc.Result(), stats_local.Result()},
            {"Attend decode, ctx 4096, 32q/8kv", attend_rpc.Result(), attend_local.Result()},
            {"  the same handed to a thread", attend_handoff.Result(), attend_local.Result()},
            {"Attend at pos 0 (8 KB each way)", attend_first_rpc.Result(),
             attend_first_local.Result()}};
    popn_vs_health_after = popn_rpc.Result().p50 / health_after_append.Result().p50;
  }
  std::filesystem::remove_all(dir);
  std::printf(
      "rpc_bench: %u cores; every row's in-process column is the same KvStore call "
      "without gRPC\n",
      std::thread::hardware_concurrency());
  PrintTable(rows);
  std::printf("Popn(1) / Health/Check after the same untimed append: %.2f\n", popn_vs_health_after);
  return 0;
}

}  // namespace
}  // namespace kvarena

int main(int argc, char** argv) {
  std::string kvarenad = kvarena::DefaultKvarenadPath();
  bool quick = false;
  int num_threads = -1;
  kvarena::PoolAwake awake;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (awake.Parse(arg)) continue;
    if (arg.rfind("--kvarenad=", 0) == 0) {
      kvarenad = arg.substr(11);
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg.rfind("--num_threads=", 0) == 0) {
      num_threads = std::stoi(arg.substr(14));
    } else {
      std::fprintf(stderr,
                   "usage: %s [--kvarenad=PATH] [--quick] [--num_threads=N] "
                   "[--cpu_pool_awake_us=U]\n",
                   argv[0]);
      return 2;
    }
  }
  return kvarena::Run(kvarenad, quick, num_threads, awake);
}
