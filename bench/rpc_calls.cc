// rpc_calls: a load driver that makes N calls of one kind, one after another, to a running
// kvarenad — for profiling the daemon's per-call cost under callgrind
// (bench/rpc_callgrind.sh), where wall-clock time means nothing. `setup` allocates what
// the calls need: an "append" cache, a "context" cache prefilled with 4096 tokens (the
// decode Attend of bench/rpc_bench), and caches of 12 distinct specs, so Stats reports a
// dozen pools. Each call's status is checked; the first failure ends the run (exit 1).
//
// Usage: rpc_calls --address=unix:PATH
//                  --method=setup|ping|health|append|popn|stats|attend|attend0 [--n=N]
//   attend is the decode Attend at position 4095; attend0 the same call at position 0 (one
//   key: the 8 KB in and 8 KB out with next to no kernel, rpc_bench's "Attend at pos 0").
//   append writes positions 0..N-1 of the "append" cache, which must be empty (as setup
//   leaves it); popn with the same N empties it again.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/half_tensor.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvarena/v1/kvarena.grpc.pb.h"

namespace kvarena {
namespace {

constexpr int kKvHeads = 8, kQHeads = 32, kHeadDim = 128, kContext = 4096, kPools = 12;

struct Driver {
  std::unique_ptr<v1::KvCacheService::Stub> kv;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;

  template <typename Method, typename Req, typename Resp>
  bool Call(Method method, const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    const grpc::Status s = ((*kv).*method)(&ctx, req, resp);
    if (!s.ok()) std::fprintf(stderr, "rpc_calls: %s\n", s.error_message().c_str());
    return s.ok();
  }

  bool Allocate(const std::string& id, int head_dim) {
    v1::AllocateRequest req;
    req.set_cache_id(id);
    req.mutable_spec()->set_num_layers(1);
    req.mutable_spec()->set_num_kv_heads(kKvHeads);
    req.mutable_spec()->set_head_dim(head_dim);
    req.mutable_spec()->set_dtype(v1::FLOAT16);
    v1::AllocateResponse resp;
    return Call(&v1::KvCacheService::Stub::Allocate, req, &resp);
  }

  bool Setup() {
    std::mt19937 rng(1);
    if (!Allocate("append", kHeadDim) || !Allocate("context", kHeadDim)) return false;
    // "append" and "context" share one pool (one spec); eleven more head_dims, eleven more.
    for (int i = 1; i < kPools; ++i) {
      if (!Allocate("pool" + std::to_string(i), 8 * i)) return false;
    }
    v1::AppendRequest prefill;
    prefill.set_cache_id("context");
    for (int pos = 0; pos < kContext; pos += 512) {
      prefill.set_pos(pos);
      *prefill.mutable_k() = HalfTensor(kKvHeads, 512, kHeadDim, &rng);
      *prefill.mutable_v() = HalfTensor(kKvHeads, 512, kHeadDim, &rng);
      v1::AppendResponse r;
      if (!Call(&v1::KvCacheService::Stub::Append, prefill, &r)) return false;
    }
    return true;
  }

  bool Run(const std::string& method, int n) {
    std::mt19937 rng(2);
    if (method == "setup") return Setup();
    if (method == "ping") {
      v1::PingResponse resp;
      for (int i = 0; i < n; ++i) {
        if (!Call(&v1::KvCacheService::Stub::Ping, v1::PingRequest(), &resp)) return false;
      }
      return true;
    }
    if (method == "health") {
      grpc::health::v1::HealthCheckResponse resp;
      for (int i = 0; i < n; ++i) {
        grpc::ClientContext ctx;
        if (!health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok()) return false;
      }
      return true;
    }
    if (method == "append") {
      v1::AppendRequest req;
      req.set_cache_id("append");
      *req.mutable_k() = HalfTensor(kKvHeads, 1, kHeadDim, &rng);
      *req.mutable_v() = HalfTensor(kKvHeads, 1, kHeadDim, &rng);
      v1::AppendResponse resp;
      for (int i = 0; i < n; ++i) {
        req.set_pos(uint64_t(i));
        if (!Call(&v1::KvCacheService::Stub::Append, req, &resp)) return false;
      }
      return true;
    }
    if (method == "popn") {
      v1::PopnRequest req;
      req.set_cache_id("append");
      req.set_n(1);
      v1::PopnResponse resp;
      for (int i = 0; i < n; ++i) {
        if (!Call(&v1::KvCacheService::Stub::Popn, req, &resp)) return false;
      }
      return true;
    }
    if (method == "stats") {
      v1::StatsResponse resp;
      for (int i = 0; i < n; ++i) {
        if (!Call(&v1::KvCacheService::Stub::Stats, v1::StatsRequest(), &resp)) return false;
      }
      return true;
    }
    if (method == "attend" || method == "attend0") {
      v1::AttendRequest req;
      req.set_cache_id("context");
      req.set_pos(method == "attend" ? kContext - 1 : 0);
      *req.mutable_q() = HalfTensor(kQHeads, 1, kHeadDim, &rng);
      v1::AttendResponse resp;
      for (int i = 0; i < n; ++i) {
        if (!Call(&v1::KvCacheService::Stub::Attend, req, &resp)) return false;
      }
      return true;
    }
    std::fprintf(stderr, "rpc_calls: unknown --method=%s\n", method.c_str());
    return false;
  }
};

}  // namespace
}  // namespace kvarena

int main(int argc, char** argv) {
  std::string address, method;
  int n = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--address=", 0) == 0) {
      address = arg.substr(10);
    } else if (arg.rfind("--method=", 0) == 0) {
      method = arg.substr(9);
    } else if (arg.rfind("--n=", 0) == 0) {
      n = std::atoi(arg.c_str() + 4);
    } else {
      address.clear();
      break;
    }
  }
  if (address.empty() || method.empty() || n < 0) {
    std::fprintf(stderr,
                 "usage: %s --address=unix:PATH "
                 "--method=setup|ping|health|append|popn|stats|attend|attend0 [--n=N]\n",
                 argv[0]);
    return 2;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  const auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  kvarena::Driver driver{kvarena::v1::KvCacheService::NewStub(channel),
                         grpc::health::v1::Health::NewStub(channel)};
  return driver.Run(method, n) ? 0 : 1;
}
