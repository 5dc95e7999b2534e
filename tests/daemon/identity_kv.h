// Test-only: a prefix's identity (docs/prefix-reuse.md, docs/tiers.md) as the tier
// identity tests flip it, one field at a time, against real kvarenad processes
// (tests/daemon/tier_identity_test.cc, tests/redis/redis_identity_test.cc). The base is
// prompt_kv.h's geometry (2 layers x 2 kv heads x head_dim 8, page_size 4, float32) in a
// quantized KV format, with non-unit fp8 static scales; every call may carry a tenant's
// bearer token (tests/access/tenant_fixture.h sets tenants up the same way).
#ifndef KVARENA_TESTS_DAEMON_IDENTITY_KV_H_
#define KVARENA_TESTS_DAEMON_IDENTITY_KV_H_

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "tests/daemon/prompt_kv.h"
#include "tests/support/temp_dir.h"

namespace kvarena {

inline constexpr char kIdentityAlice[] = "alice-token-0123456789abcdef";
inline constexpr char kIdentityBob[] = "bob-token-0123456789abcdef";

// Writes a tenants file with alice and bob (tokens above) into dir; returns the flag.
inline std::string IdentityTenantsFlag(const TempDir& dir) {
  std::ofstream(dir.path() + "/alice.token") << kIdentityAlice << "\n";
  std::ofstream(dir.path() + "/bob.token") << kIdentityBob << "\n";
  std::ofstream(dir.path() + "/tenants") << "alice alice.token\nbob bob.token\n";
  return "--tenants_file=" + dir.path() + "/tenants";
}

inline std::unique_ptr<grpc::ClientContext> TokenCtx(const std::string& token) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

// fp8 scales for `layers` x `heads` (none of the base's is 1): head h of layer l gets K scale
// 0.5 + l/4 + h/8 and V scale 1 more, so a spec with fewer heads or more layers keeps the
// scales of the heads both have.
inline void SetScales(v1::CacheSpec* spec) {
  spec->clear_k_scales();
  spec->clear_v_scales();
  if (spec->kv_format() != v1::KV_FP8_E4M3) return;
  for (uint32_t l = 0; l < spec->num_layers(); ++l) {
    for (uint32_t h = 0; h < spec->num_kv_heads(); ++h) {
      spec->add_k_scales(0.5f + 0.25f * float(l) + 0.125f * float(h));
      spec->add_v_scales(1.5f + 0.25f * float(l) + 0.125f * float(h));
    }
  }
}

inline v1::CacheSpec IdentityBase(v1::KvFormat format) {
  v1::CacheSpec s = Spec(kPromptLayers, kPromptHeads, kPromptDim);
  s.set_prefix_namespace("model");
  s.set_kv_format(format);
  SetScales(&s);
  return s;
}

// The formats the identity tests run under (as a test parameter), and their names.
inline auto QuantizedKvFormats() { return ::testing::Values(v1::KV_INT8, v1::KV_FP8_E4M3); }
inline std::string KvFormatParamName(const ::testing::TestParamInfo<v1::KvFormat>& info) {
  return v1::KvFormat_Name(info.param);
}

// A spec that differs from the base in one identity field, and the token it is used with.
struct Flip {
  std::string name;
  v1::CacheSpec spec;
  std::string token;
};

// Every one-field flip of `base` (float32, 2 layers, 2 heads; tenant alice).
inline std::vector<Flip> IdentityFlips(const v1::CacheSpec& base) {
  std::vector<Flip> out;
  auto add = [&](const std::string& name, auto change) {
    Flip f{name, base, kIdentityAlice};
    change(&f.spec);
    out.push_back(std::move(f));
  };
  const bool fp8 = base.kv_format() == v1::KV_FP8_E4M3;
  add(fp8 ? "kv_format int8" : "kv_format fp8_e4m3", [&](v1::CacheSpec* s) {
    s->set_kv_format(fp8 ? v1::KV_INT8 : v1::KV_FP8_E4M3);
    SetScales(s);
  });
  add("kv_format float32 (the dtype's own)", [](v1::CacheSpec* s) {
    s->set_kv_format(v1::KV_FLOAT32);
    SetScales(s);
  });
  if (fp8) {
    add("k_scales[0]", [](v1::CacheSpec* s) { s->set_k_scales(0, s->k_scales(0) * 2); });
    add("v_scales[3]", [](v1::CacheSpec* s) { s->set_v_scales(3, s->v_scales(3) / 2); });
  }
  add("page_size 8", [](v1::CacheSpec* s) { s->set_page_size(8); });
  add("num_kv_heads 1", [](v1::CacheSpec* s) {
    s->set_num_kv_heads(1);
    SetScales(s);
  });
  add("head_dim 16", [](v1::CacheSpec* s) { s->set_head_dim(16); });
  add("num_layers 3", [](v1::CacheSpec* s) {
    s->set_num_layers(3);
    SetScales(s);
  });
  add("dtype float16", [](v1::CacheSpec* s) { s->set_dtype(v1::FLOAT16); });
  add("layer_windows {0, 8}", [](v1::CacheSpec* s) {
    s->add_layer_windows(0);
    s->add_layer_windows(8);
  });
  add("prefix_namespace", [](v1::CacheSpec* s) { s->set_prefix_namespace("model2"); });
  add("tenant bob", [](v1::CacheSpec*) {});
  out.back().token = kIdentityBob;
  return out;
}

// Allocates a cache of `spec` for the prompt's tokens (asserting success).
inline v1::CacheInfo AllocateAs(v1::KvCacheService::Stub* stub, const std::string& token,
                                const v1::CacheSpec& spec, const std::vector<int32_t>& tokens) {
  v1::AllocateRequest req;
  *req.mutable_spec() = spec;
  req.mutable_prompt_tokens()->Assign(tokens.begin(), tokens.end());
  v1::AllocateResponse resp;
  const grpc::Status s = stub->Allocate(TokenCtx(token).get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message() << " " << spec.ShortDebugString();
  return resp.cache();
}

inline void ReleaseAs(v1::KvCacheService::Stub* stub, const std::string& token,
                      const std::string& id) {
  v1::ReleaseRequest req;
  req.set_cache_id(id);
  v1::ReleaseResponse resp;
  ASSERT_TRUE(stub->Release(TokenCtx(token).get(), req, &resp).ok());
}

// Appends all of the prompt's K/V to every layer of cache id.
inline void ComputeAs(v1::KvCacheService::Stub* stub, const std::string& token,
                      const std::string& id, const Prompt& p) {
  for (uint32_t l = 0; l < kPromptLayers; ++l) {
    v1::AppendRequest req;
    req.set_cache_id(id);
    req.set_layer(l);
    *req.mutable_k() = p.k[l];
    *req.mutable_v() = p.v[l];
    v1::AppendResponse resp;
    const grpc::Status s = stub->Append(TokenCtx(token).get(), req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
}

// Every layer's K then V as GetKv returns them (the activation dtype), first n positions.
inline std::vector<std::string> KvBytesAs(v1::KvCacheService::Stub* stub, const std::string& token,
                                          const std::string& id, int n) {
  std::vector<std::string> out;
  for (uint32_t l = 0; l < kPromptLayers; ++l) {
    v1::GetKvRequest req;
    req.set_cache_id(id);
    req.set_layer(l);
    v1::GetKvResponse resp;
    const grpc::Status s = stub->GetKv(TokenCtx(token).get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    out.push_back(SliceTokens(resp.k(), 0, n).data());
    out.push_back(SliceTokens(resp.v(), 0, n).data());
  }
  return out;
}

// got and want (KvBytesAs) hold the same bytes, layer by layer.
inline void ExpectSameKv(const std::vector<std::string>& got,
                         const std::vector<std::string>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i] == want[i]) << (i % 2 == 0 ? "K" : "V") << " of layer " << i / 2
                                   << " differs (" << got[i].size() << " bytes)";
  }
}

// Allocates every flip with the prompt: none may take a position from the arena or a tier.
inline void ExpectFlipsMiss(v1::KvCacheService::Stub* stub, const v1::CacheSpec& base,
                            const std::vector<int32_t>& tokens) {
  for (const Flip& f : IdentityFlips(base)) {
    const v1::CacheInfo info = AllocateAs(stub, f.token, f.spec, tokens);
    EXPECT_EQ(info.cached_tokens(), 0u) << f.name;
    EXPECT_EQ(info.tier_loaded_tokens(), 0u) << f.name;
    if (!info.cache_id().empty()) {
      ASSERT_NO_FATAL_FAILURE(ReleaseAs(stub, f.token, info.cache_id()));
    }
  }
}

}  // namespace kvarena

#endif  // KVARENA_TESTS_DAEMON_IDENTITY_KV_H_
