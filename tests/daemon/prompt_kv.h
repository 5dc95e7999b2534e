// Test-only: a prompt and the K/V a worker computed for it, and the calls the tier tests
// make with them against any kvarenad (tests/daemon/tiers_rpc_test.cc, tests/redis/
// redis_nodes_test.cc): allocate with the prompt, append its K/V from a position, release,
// and check a cache against one that computed everything itself. The caches are
// 2 layers x 2 kv heads x head_dim 8, float32, page_size 4 (512-byte pages).
#ifndef KVARENA_TESTS_DAEMON_PROMPT_KV_H_
#define KVARENA_TESTS_DAEMON_PROMPT_KV_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/daemon/rpc_test_util.h"

namespace kvarena {

inline constexpr int kPromptLayers = 2, kPromptHeads = 2, kPromptDim = 8;

struct Prompt {
  std::vector<int32_t> tokens;
  std::vector<v1::Tensor> k, v;  // per layer, [1, heads, tokens, head_dim]
};

// n token ids and their K/V, all from `seed`.
inline Prompt MakePrompt(int n, uint32_t seed) {
  Prompt p;
  std::mt19937 rng(seed);
  for (int i = 0; i < n; ++i) p.tokens.push_back(int32_t(rng() % 50000));
  for (int l = 0; l < kPromptLayers; ++l) {
    p.k.push_back(RandomTensor(v1::FLOAT32, kPromptHeads, n, kPromptDim, seed * 10 + uint32_t(l)));
    p.v.push_back(
        RandomTensor(v1::FLOAT32, kPromptHeads, n, kPromptDim, seed * 10 + 5 + uint32_t(l)));
  }
  return p;
}

// Allocates a cache for the prompt's tokens in namespace ns (asserting success).
inline v1::CacheInfo AllocatePrompt(v1::KvCacheService::Stub* stub,
                                    const std::vector<int32_t>& tokens,
                                    const std::string& ns = "model") {
  v1::AllocateRequest req;
  *req.mutable_spec() = Spec(kPromptLayers, kPromptHeads, kPromptDim);
  req.mutable_spec()->set_prefix_namespace(ns);
  req.mutable_prompt_tokens()->Assign(tokens.begin(), tokens.end());
  v1::AllocateResponse resp;
  grpc::ClientContext ctx;
  const grpc::Status s = stub->Allocate(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.cache();
}

// Appends the prompt's K/V of positions [from, end) to every layer of cache id.
inline void ComputePrompt(v1::KvCacheService::Stub* stub, const std::string& id, const Prompt& p,
                          int from) {
  const int n = int(p.tokens.size()) - from;
  for (int l = 0; l < kPromptLayers; ++l) {
    v1::AppendRequest req;
    req.set_cache_id(id);
    req.set_layer(uint32_t(l));
    req.set_pos(uint64_t(from));
    *req.mutable_k() = SliceTokens(p.k[size_t(l)], from, n);
    *req.mutable_v() = SliceTokens(p.v[size_t(l)], from, n);
    v1::AppendResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = stub->Append(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
}

inline void ReleaseCache(v1::KvCacheService::Stub* stub, const std::string& id) {
  v1::ReleaseRequest req;
  req.set_cache_id(id);
  v1::ReleaseResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->Release(&ctx, req, &resp).ok());
}

// Completes cache b (allocated with p's prompt) with p's K/V and checks that it holds and
// attends exactly as a cache that computed everything in namespace `fresh_ns` (new to
// the daemon); releases both.
inline void ExpectAsRecomputed(v1::KvCacheService::Stub* stub, const v1::CacheInfo& b,
                               const Prompt& p, const std::string& fresh_ns) {
  ASSERT_NO_FATAL_FAILURE(ComputePrompt(stub, b.cache_id(), p, int(b.cached_tokens())));
  const v1::CacheInfo r = AllocatePrompt(stub, p.tokens, fresh_ns);
  ASSERT_EQ(r.cached_tokens(), 0u);
  ASSERT_NO_FATAL_FAILURE(ComputePrompt(stub, r.cache_id(), p, 0));
  for (uint32_t l = 0; l < kPromptLayers; ++l) {
    v1::GetKvRequest get;
    get.set_layer(l);
    v1::GetKvResponse got, want;
    get.set_cache_id(b.cache_id());
    grpc::ClientContext c1, c2;
    ASSERT_TRUE(stub->GetKv(&c1, get, &got).ok());
    get.set_cache_id(r.cache_id());
    ASSERT_TRUE(stub->GetKv(&c2, get, &want).ok());
    EXPECT_EQ(got.k().data(), want.k().data()) << "layer " << l;
    EXPECT_EQ(got.v().data(), want.v().data()) << "layer " << l;
    v1::AttendRequest req;
    req.set_layer(l);
    req.set_pos(p.tokens.size() - 1);
    *req.mutable_q() = RandomTensor(v1::FLOAT32, kPromptHeads, 1, kPromptDim, 99);
    v1::AttendResponse out_b, out_r;
    req.set_cache_id(b.cache_id());
    grpc::ClientContext c3, c4;
    ASSERT_TRUE(stub->Attend(&c3, req, &out_b).ok());
    req.set_cache_id(r.cache_id());
    ASSERT_TRUE(stub->Attend(&c4, req, &out_r).ok());
    EXPECT_EQ(out_b.out().data(), out_r.out().data()) << "layer " << l;
  }
  ASSERT_NO_FATAL_FAILURE(ReleaseCache(stub, b.cache_id()));
  ASSERT_NO_FATAL_FAILURE(ReleaseCache(stub, r.cache_id()));
}

}  // namespace kvarena

#endif  // KVARENA_TESTS_DAEMON_PROMPT_KV_H_
