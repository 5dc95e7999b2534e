// Every RPC at the extremes of its types, against a real kvarenad: uint32/uint64 max,
// 2^31, 2^63, shapes whose byte count wraps, empty / short / long data, shared slices
// whose offset + length overflows or that name another session's region, empty and
// 1 MiB cache ids. Each request gets its specific code, changes nothing a client can see
// (stats, description, every layer's K/V), and the daemon answers the next call.
// Several of these once killed the daemon (SIGFPE, SIGSEGV), answered UNKNOWN with pages
// leaked, or handed out another session's bytes.
#include <cmath>
#include <functional>
#include <limits>

#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using grpc::StatusCode;

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr uint32_t kU32Max = std::numeric_limits<uint32_t>::max();
constexpr uint64_t k2To63 = uint64_t{1} << 63;
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

class ExtremesTest : public KvarenadTest {
 public:  // the case table's lambdas call these through a pointer
  using KvarenadTest::Append;
  using KvarenadTest::AppendF32;
  v1::KvCacheService::Stub* stub() { return stub_.get(); }

  // Cache "c": float32, 2 layers, 2 kv heads, head_dim 8, page 4, 5 tokens per layer;
  // cache "d" of the same geometry, empty. A session with a scratch region, "other" too.
  void SetUp() override {
    StartDaemon({"--arena_bytes=64Mi", "--scratch_bytes=2Mi"});
    for (const char* id : {"c", "d"}) {
      v1::AllocateRequest req;
      *req.mutable_spec() = Spec(2, 2, 8);
      req.set_cache_id(id);
      v1::AllocateResponse resp;
      ASSERT_TRUE(stub_->Allocate(Ctx().get(), req, &resp).ok());
    }
    for (uint32_t l = 0; l < 2; ++l) ASSERT_TRUE(AppendF32("c", l, 0, 5, 2, 8, 1.0f + l).ok());
    session_ = Attach("extremes");
    other_ = Attach("other");
  }

  // What a request may not change: c and d, and the arena (refusal counters aside).
  std::string State() { return Snapshot("c") + Snapshot("d"); }

  v1::AttendRequest Query(uint64_t pos, int q_heads = 2, int n = 1) {
    v1::AttendRequest req;
    req.set_cache_id("c");
    req.set_pos(pos);
    *req.mutable_q() = F32Tensor(q_heads, n, 8, 3);
    return req;
  }
  grpc::Status Attend(const v1::AttendRequest& req, const std::string& session = "") {
    v1::AttendResponse resp;
    return stub_->Attend(Ctx(session).get(), req, &resp);
  }
  grpc::Status AllocateSpec(const std::function<void(v1::CacheSpec*)>& mutate) {
    v1::AllocateRequest req;
    *req.mutable_spec() = Spec(2, 2, 8);
    mutate(req.mutable_spec());
    v1::AllocateResponse resp;
    return stub_->Allocate(Ctx().get(), req, &resp);
  }
  grpc::Status Reserve(std::vector<std::pair<std::string, uint64_t>> items,
                       const std::string& session = "") {
    v1::ReserveRequest req;
    for (const auto& [id, n] : items) {
      v1::CacheTokens* t = req.add_items();
      t->set_cache_id(id);
      t->set_tokens(n);
    }
    v1::ReserveResponse resp;
    return stub_->Reserve(Ctx(session).get(), req, &resp);
  }
  grpc::Status Commit(const std::string& id, uint64_t tokens) {
    v1::CommitRequest req;
    v1::CacheTokens* t = req.add_items();
    t->set_cache_id(id);
    t->set_tokens(tokens);
    v1::CommitResponse resp;
    return stub_->Commit(Ctx().get(), req, &resp);
  }
  grpc::Status GetKvRange(uint32_t layer, uint64_t from, uint64_t max) {
    v1::GetKvRequest req;
    req.set_cache_id("c");
    req.set_layer(layer);
    req.set_from_pos(from);
    req.set_max_tokens(max);
    v1::GetKvResponse resp;
    return stub_->GetKv(Ctx().get(), req, &resp);
  }
  grpc::Status AllocatePrompt(const std::vector<int32_t>& prompt, const std::string& ns = "m") {
    v1::AllocateRequest req;
    *req.mutable_spec() = Spec(2, 2, 8);
    req.mutable_spec()->set_prefix_namespace(ns);
    req.mutable_prompt_tokens()->Assign(prompt.begin(), prompt.end());
    v1::AllocateResponse resp;
    return stub_->Allocate(Ctx().get(), req, &resp);
  }
  grpc::Status SetTokens(const std::string& id, uint64_t first_pos,
                         const std::vector<int32_t>& ids) {
    v1::SetTokensRequest req;
    req.set_cache_id(id);
    req.set_first_pos(first_pos);
    req.mutable_token_ids()->Assign(ids.begin(), ids.end());
    v1::SetTokensResponse resp;
    return stub_->SetTokens(Ctx().get(), req, &resp);
  }
  grpc::Status Fork(const std::string& id, const std::string& new_id) {
    v1::ForkRequest req;
    req.set_cache_id(id);
    req.set_new_cache_id(new_id);
    v1::ForkResponse resp;
    return stub_->Fork(Ctx().get(), req, &resp);
  }
  grpc::Status Popn(uint64_t n, std::string* refusal) {
    v1::PopnRequest req;
    req.set_cache_id("c");
    req.set_n(n);
    v1::PopnResponse resp;
    grpc::Status s = stub_->Popn(Ctx().get(), req, &resp);
    *refusal = resp.refusal();
    EXPECT_EQ(resp.popped(), 0u);
    return s;
  }
  // A [1, 2, 1, 8] float32 k in the session's scratch region at [offset, +length).
  v1::Tensor Shared(uint64_t region, uint64_t offset, uint64_t length) {
    v1::Tensor t = F32Tensor(2, 1, 8, 1);
    t.mutable_shared()->set_region_id(region);
    t.mutable_shared()->set_offset(offset);
    t.mutable_shared()->set_length(length);
    return t;
  }
  uint64_t ScratchOf(const std::string& session) {
    // The scratch region ids are handed out in Attach order from 2^32.
    return session == session_ ? (uint64_t{1} << 32) : (uint64_t{1} << 32) + 1;
  }

  std::string session_;
  std::string other_;
};

struct Case {
  const char* name;
  std::function<grpc::Status(ExtremesTest*)> call;
  StatusCode code;
  const char* message;  // a substring of the status message ("" for OK)
};

TEST_F(ExtremesTest, EveryRpcAtItsExtremesGetsItsCodeAndChangesNothing) {
  const std::string mib_id(1 << 20, 'x');
  std::string refusal;
  const std::vector<Case> cases = {
      // Allocate: integers past their ranges, named as sent.
      {"num_layers=u32max",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) { s->set_num_layers(kU32Max); });
       },
       StatusCode::INVALID_ARGUMENT, "spec.num_layers=4294967295 must be in [1, 1024]"},
      {"num_layers=2^31",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) { s->set_num_layers(1u << 31); });
       },
       StatusCode::INVALID_ARGUMENT, "spec.num_layers=2147483648"},
      {"num_kv_heads=u32max",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) { s->set_num_kv_heads(kU32Max); });
       },
       StatusCode::INVALID_ARGUMENT, "spec.num_kv_heads=4294967295"},
      {"head_dim=u32max",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) { s->set_head_dim(kU32Max); });
       },
       StatusCode::INVALID_ARGUMENT, "spec.head_dim=4294967295"},
      {"page_size=u32max",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) { s->set_page_size(kU32Max); });
       },
       StatusCode::INVALID_ARGUMENT, "spec.page_size=4294967295"},
      {"window=u32max",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) {
           s->add_layer_windows(kU32Max);
           s->add_layer_windows(0);
         });
       },
       StatusCode::INVALID_ARGUMENT, "spec.layer_windows[0]=4294967295"},
      {"window=2^31",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) {
           s->add_layer_windows(0);
           s->add_layer_windows(1u << 31);
         });
       },
       StatusCode::INVALID_ARGUMENT, "spec.layer_windows[1]=2147483648"},
      {"max_tokens=u64max",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) { s->set_max_tokens(kU64Max); });
       },
       StatusCode::INVALID_ARGUMENT, "spec.max_tokens=18446744073709551615"},
      {"max_tokens=2^63",
       [](ExtremesTest* t) {
         return t->AllocateSpec([](v1::CacheSpec* s) { s->set_max_tokens(k2To63); });
       },
       StatusCode::INVALID_ARGUMENT, "spec.max_tokens=9223372036854775808"},
      {"cache_id of 1 MiB",
       [&mib_id](ExtremesTest* t) {
         v1::AllocateRequest req;
         *req.mutable_spec() = Spec(2, 2, 8);
         req.set_cache_id(mib_id);
         v1::AllocateResponse resp;
         return t->stub()->Allocate(Ctx().get(), req, &resp);
       },
       StatusCode::INVALID_ARGUMENT, "cache_id has 1048576 bytes; at most 256"},
      // Append.
      {"append layer=u32max",
       [](ExtremesTest* t) { return t->AppendF32("c", kU32Max, 5, 1, 2, 8, 1); },
       StatusCode::INVALID_ARGUMENT, "append: layer=4294967295"},
      {"append layer=2^31",
       [](ExtremesTest* t) { return t->AppendF32("c", 1u << 31, 5, 1, 2, 8, 1); },
       StatusCode::INVALID_ARGUMENT, "append: layer=2147483648"},
      {"append pos=u64max",
       [](ExtremesTest* t) { return t->AppendF32("c", 0, kU64Max, 1, 2, 8, 1); },
       StatusCode::INVALID_ARGUMENT, "append: pos=18446744073709551615"},
      {"append pos=2^63", [](ExtremesTest* t) { return t->AppendF32("c", 0, k2To63, 1, 2, 8, 1); },
       StatusCode::INVALID_ARGUMENT, "append: pos=9223372036854775808"},
      {"append pos=2^63-1",
       [](ExtremesTest* t) { return t->AppendF32("c", 0, kI64Max, 1, 2, 8, 1); },
       StatusCode::INVALID_ARGUMENT, "pos=9223372036854775807 but layer 0 holds 5 tokens"},
      {"append tokens=2^62, empty data",
       [](ExtremesTest* t) {
         v1::Tensor k = F32Tensor(2, 1, 8, 1);
         k.set_shape(2, int64_t{1} << 62);
         k.clear_data();
         return t->Append("c", 0, 5, k, k);
       },
       StatusCode::INVALID_ARGUMENT, "tokens=4611686018427387904"},
      {"append tokens=int64max",
       [](ExtremesTest* t) {
         v1::Tensor k = F32Tensor(2, 1, 8, 1);
         k.set_shape(2, kI64Max);
         return t->Append("c", 0, 5, k, k);
       },
       StatusCode::INVALID_ARGUMENT, "tokens=9223372036854775807"},
      {"append short data",
       [](ExtremesTest* t) {
         v1::Tensor k = F32Tensor(2, 1, 8, 1);
         k.mutable_data()->resize(1);
         return t->Append("c", 0, 5, k, k);
       },
       StatusCode::INVALID_ARGUMENT, "k has 1 bytes"},
      {"append long data",
       [](ExtremesTest* t) {
         v1::Tensor k = F32Tensor(2, 1, 8, 1);
         k.mutable_data()->resize(1 << 20);
         return t->Append("c", 0, 5, k, k);
       },
       StatusCode::INVALID_ARGUMENT, "k has 1048576 bytes"},
      {"append to an empty id", [](ExtremesTest* t) { return t->AppendF32("", 0, 0, 1, 2, 8, 1); },
       StatusCode::NOT_FOUND, "cache '' not found"},
      {"append to a 1 MiB id",
       [&mib_id](ExtremesTest* t) { return t->AppendF32(mib_id, 0, 0, 1, 2, 8, 1); },
       StatusCode::NOT_FOUND, "(1048576 bytes) not found"},
      // Attend.
      {"attend over the cache at pos=2^63-1 (was SIGFPE)",
       [](ExtremesTest* t) { return t->Attend(t->Query(kI64Max)); }, StatusCode::INVALID_ARGUMENT,
       "pos=9223372036854775807 with 1 queries"},
      {"attend over the cache at pos=u64max",
       [](ExtremesTest* t) { return t->Attend(t->Query(kU64Max)); }, StatusCode::INVALID_ARGUMENT,
       "attend: pos=18446744073709551615"},
      {"attend layer=u32max",
       [](ExtremesTest* t) {
         v1::AttendRequest req = t->Query(4);
         req.set_layer(kU32Max);
         return t->Attend(req);
       },
       StatusCode::INVALID_ARGUMENT, "attend: layer=4294967295"},
      {"attend q [1, 2^48, 256, 128] empty, with k/v",
       [](ExtremesTest* t) {
         v1::AttendRequest req = t->Query(5);
         req.mutable_q()->clear_shape();
         for (int64_t d : {int64_t{1}, int64_t{1} << 48, int64_t{256}, int64_t{128}})
           req.mutable_q()->add_shape(d);
         req.mutable_q()->clear_data();
         *req.mutable_k() = F32Tensor(2, 1, 8, 1);
         *req.mutable_v() = F32Tensor(2, 1, 8, 2);
         return t->Attend(req);
       },
       StatusCode::INVALID_ARGUMENT, "q.shape=[1, 281474976710656, 256, 128]"},
      {"attend q heads 2^31",
       [](ExtremesTest* t) {
         v1::AttendRequest req = t->Query(4);
         req.mutable_q()->set_shape(1, int64_t{1} << 31);
         return t->Attend(req);
       },
       StatusCode::INVALID_ARGUMENT, "at most 64x"},
      {"attend scale=NaN",
       [](ExtremesTest* t) {
         v1::AttendRequest req = t->Query(4);
         req.set_scale(std::nan(""));
         return t->Attend(req);
       },
       StatusCode::INVALID_ARGUMENT, "scale=nan"},
      {"attend scale=-inf",
       [](ExtremesTest* t) {
         v1::AttendRequest req = t->Query(4);
         req.set_scale(-INFINITY);
         return t->Attend(req);
       },
       StatusCode::INVALID_ARGUMENT, "must be finite"},
      {"attend window=u32max reads, changes nothing",
       [](ExtremesTest* t) {
         v1::AttendRequest req = t->Query(4);
         req.set_window(kU32Max);
         return t->Attend(req);
       },
       StatusCode::OK, ""},
      // Shared slices.
      {"slice offset=u64max",
       [](ExtremesTest* t) {
         return t->Append("c", 0, 5, t->Shared(t->ScratchOf(t->session_), kU64Max, 64),
                          t->Shared(t->ScratchOf(t->session_), 0, 64), t->session_);
       },
       StatusCode::INVALID_ARGUMENT, "lies outside the scratch region"},
      {"slice offset + length overflows",
       [](ExtremesTest* t) {
         return t->Append("c", 0, 5, t->Shared(t->ScratchOf(t->session_), k2To63, k2To63),
                          t->Shared(t->ScratchOf(t->session_), 0, 64), t->session_);
       },
       StatusCode::INVALID_ARGUMENT, "lies outside the scratch region"},
      {"slice of another session's region",
       [](ExtremesTest* t) {
         return t->Append("c", 0, 5, t->Shared(t->ScratchOf(t->other_), 0, 64),
                          t->Shared(t->ScratchOf(t->other_), 64, 64), t->session_);
       },
       StatusCode::PERMISSION_DENIED, "is not this session's scratch region"},
      {"slice of region 0 (a pool's id space)",
       [](ExtremesTest* t) {
         v1::AttendRequest req = t->Query(4);
         req.mutable_out()->set_region_id(0);
         req.mutable_out()->set_length(64);
         return t->Attend(req, t->session_);
       },
       StatusCode::PERMISSION_DENIED, "attend: out: shared slice"},
      // Popn: any n past seq_len is a refusal, not an error.
      {"popn n=u64max", [&refusal](ExtremesTest* t) { return t->Popn(kU64Max, &refusal); },
       StatusCode::OK, ""},
      {"popn n=2^63", [&refusal](ExtremesTest* t) { return t->Popn(k2To63, &refusal); },
       StatusCode::OK, ""},
      // Reserve / Commit.
      {"reserve tokens=u64max",
       [](ExtremesTest* t) {
         return t->Reserve({{"d", kU64Max}});
       },
       StatusCode::INVALID_ARGUMENT, "reserve: items[0].tokens=18446744073709551615"},
      {"reserve tokens=2^63-1",
       [](ExtremesTest* t) {
         return t->Reserve({{"d", uint64_t(kI64Max)}});
       },
       StatusCode::INVALID_ARGUMENT, "tokens=9223372036854775807"},
      {"reserve whose page total wraps across caches (was UNKNOWN, pages leaked)",
       [](ExtremesTest* t) {
         return t->Reserve({{"c", uint64_t{1} << 61}, {"d", uint64_t{1} << 62}});
       },
       StatusCode::INVALID_ARGUMENT, "tokens=2305843009213693952"},
      {"reserve of 70000 items",
       [](ExtremesTest* t) {
         std::vector<std::pair<std::string, uint64_t>> items(70000, {"d", 1});
         return t->Reserve(items);
       },
       StatusCode::INVALID_ARGUMENT, "70000 items; at most 65536"},
      {"commit tokens=2^63-1 (was accepted; the next append was SIGSEGV)",
       [](ExtremesTest* t) { return t->Commit("d", uint64_t(kI64Max)); },
       StatusCode::INVALID_ARGUMENT, "tokens=9223372036854775807"},
      {"commit tokens=u64max", [](ExtremesTest* t) { return t->Commit("d", kU64Max); },
       StatusCode::INVALID_ARGUMENT, "items[0].tokens=18446744073709551615"},
      // GetKv.
      {"get_kv layer=u32max", [](ExtremesTest* t) { return t->GetKvRange(kU32Max, 0, 0); },
       StatusCode::INVALID_ARGUMENT, "get_kv: layer=4294967295"},
      {"get_kv from_pos=u64max", [](ExtremesTest* t) { return t->GetKvRange(0, kU64Max, 0); },
       StatusCode::INVALID_ARGUMENT, "get_kv: from_pos=18446744073709551615"},
      {"get_kv max_tokens=2^63", [](ExtremesTest* t) { return t->GetKvRange(0, 0, k2To63); },
       StatusCode::INVALID_ARGUMENT, "get_kv: max_tokens=9223372036854775808"},
      {"get_kv from_pos=2^63-1 is an empty range",
       [](ExtremesTest* t) { return t->GetKvRange(0, uint64_t(kI64Max), 1); }, StatusCode::OK, ""},
      // Prefix reuse: prompt_tokens, SetTokens, Fork.
      {"allocate prompt_tokens with a negative id",
       [](ExtremesTest* t) {
         return t->AllocatePrompt({1, -1, 2});
       },
       StatusCode::INVALID_ARGUMENT, "allocate: prompt_tokens[1]=-1 must be >= 0"},
      {"allocate prompt_tokens of 2^20 + 1 ids",
       [](ExtremesTest* t) { return t->AllocatePrompt(std::vector<int32_t>((1 << 20) + 1, 7)); },
       StatusCode::INVALID_ARGUMENT, "prompt_tokens has 1048577 token ids; at most 1048576"},
      {"allocate prompt_tokens of int32 min",
       [](ExtremesTest* t) { return t->AllocatePrompt({std::numeric_limits<int32_t>::min()}); },
       StatusCode::INVALID_ARGUMENT, "prompt_tokens[0]=-2147483648"},
      {"allocate a 1 MiB prefix_namespace",
       [&mib_id](ExtremesTest* t) { return t->AllocatePrompt({1}, mib_id); },
       StatusCode::INVALID_ARGUMENT, "spec.prefix_namespace has 1048576 bytes; at most 1024"},
      {"set_tokens first_pos=u64max",
       [](ExtremesTest* t) { return t->SetTokens("c", kU64Max, {1}); },
       StatusCode::INVALID_ARGUMENT,
       "set_tokens: first_pos=18446744073709551615 must be below 2^63"},
      {"set_tokens first_pos=2^63-1",
       [](ExtremesTest* t) { return t->SetTokens("c", uint64_t(kI64Max), {1}); },
       StatusCode::INVALID_ARGUMENT,
       "first_pos=9223372036854775807 but cache 'c' knows the token ids of positions [0, 0)"},
      {"set_tokens past what is known (a gap)",
       [](ExtremesTest* t) { return t->SetTokens("c", 1, {1}); }, StatusCode::INVALID_ARGUMENT,
       "set_tokens: first_pos=1"},
      {"set_tokens a negative id",
       [](ExtremesTest* t) {
         return t->SetTokens("c", 0, {3, -5});
       },
       StatusCode::INVALID_ARGUMENT, "set_tokens: token_ids[1]=-5 must be >= 0"},
      {"set_tokens 2^20 + 1 ids",
       [](ExtremesTest* t) { return t->SetTokens("c", 0, std::vector<int32_t>((1 << 20) + 1, 1)); },
       StatusCode::INVALID_ARGUMENT, "token_ids has 1048577 token ids"},
      {"set_tokens on a missing cache",
       [](ExtremesTest* t) { return t->SetTokens("nope", 0, {1}); }, StatusCode::NOT_FOUND,
       "cache 'nope' not found"},
      {"set_tokens of no ids changes nothing",
       [](ExtremesTest* t) { return t->SetTokens("c", 0, {}); }, StatusCode::OK, ""},
      {"fork a missing cache", [](ExtremesTest* t) { return t->Fork("nope", "e"); },
       StatusCode::NOT_FOUND, "cache 'nope' not found"},
      {"fork an empty id", [](ExtremesTest* t) { return t->Fork("", "e"); }, StatusCode::NOT_FOUND,
       "cache '' not found"},
      {"fork into an id in use", [](ExtremesTest* t) { return t->Fork("c", "d"); },
       StatusCode::ALREADY_EXISTS, "fork: cache 'd' already exists"},
      {"fork into a 1 MiB id", [&mib_id](ExtremesTest* t) { return t->Fork("c", mib_id); },
       StatusCode::INVALID_ARGUMENT, "fork: new_cache_id has 1048576 bytes; at most 256"},
      // Ids on every other RPC.
      {"describe a 1 MiB id",
       [&mib_id](ExtremesTest* t) {
         v1::DescribeRequest req;
         req.set_cache_id(mib_id);
         v1::DescribeResponse resp;
         return t->stub()->Describe(Ctx().get(), req, &resp);
       },
       StatusCode::NOT_FOUND, "(1048576 bytes) not found"},
      {"stats of a 1 MiB id",
       [&mib_id](ExtremesTest* t) {
         v1::StatsRequest req;
         req.set_cache_id(mib_id);
         v1::StatsResponse resp;
         return t->stub()->Stats(Ctx().get(), req, &resp);
       },
       StatusCode::NOT_FOUND, "(1048576 bytes) not found"},
      {"release an empty id",
       [](ExtremesTest* t) {
         v1::ReleaseRequest req;
         v1::ReleaseResponse resp;
         return t->stub()->Release(Ctx().get(), req, &resp);
       },
       StatusCode::NOT_FOUND, "cache '' not found"},
      {"reset a 1 MiB id",
       [&mib_id](ExtremesTest* t) {
         v1::ResetRequest req;
         req.set_cache_id(mib_id);
         v1::ResetResponse resp;
         return t->stub()->Reset(Ctx().get(), req, &resp);
       },
       StatusCode::NOT_FOUND, "(1048576 bytes) not found"},
      {"a request above --max_message_bytes",
       [](ExtremesTest* t) {
         v1::ReleaseRequest req;
         req.set_cache_id(std::string(size_t{65} << 20, 'y'));
         v1::ReleaseResponse resp;
         return t->stub()->Release(Ctx().get(), req, &resp);
       },
       StatusCode::RESOURCE_EXHAUSTED, ""},
  };
  const std::string before = State();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const grpc::Status s = c.call(this);
    EXPECT_THAT(s, StatusIs(c.code, c.message));
    EXPECT_LT(s.error_message().size(), 400u) << "messages echo a short prefix of what was sent";
    v1::PingResponse pong;
    ASSERT_TRUE(stub_->Ping(Ctx().get(), v1::PingRequest(), &pong).ok()) << "the daemon died";
    EXPECT_EQ(State(), before);
  }
  EXPECT_EQ(refusal, "popn: n=9223372036854775808 but seq_len=5");
  EXPECT_GT(Stats().pages().refusals(), 0u);
}

// A refusal once echoed an 8 KiB cache id whole: the trailer passed the client's metadata
// limit and tore down the connection, and with it the session's Attach stream.
TEST_F(ExtremesTest, ALongIdDoesNotTearDownTheCallersConnection) {
  const std::string id(8 << 10, 'z');
  EXPECT_THAT(AppendF32(id, 0, 0, 1, 2, 8, 1, session_), StatusIs(StatusCode::NOT_FOUND));
  v1::AllocateRequest req;
  *req.mutable_spec() = Spec(1, 2, 8);
  v1::AllocateResponse resp;
  EXPECT_TRUE(stub_->Allocate(Ctx(session_).get(), req, &resp).ok()) << "the session is gone";
}

// Reserve + Commit without writes, then GetKv, once returned the bytes of the cache whose
// pages were freed last, across sessions and users (a sessionless TCP client read them).
class TcpReaderTest : public KvarenadTest {
 protected:
  void SetUp() override {
    port_ = PickUnusedPort();
    StartDaemon({"--arena_bytes=64Mi", "--scratch_bytes=2Mi",
                 absl::StrCat("--listen=unix:", dir_.path(), "/k.sock,127.0.0.1:", port_)});
  }
  TempDir dir_;
  int port_ = 0;
};

TEST_F(TcpReaderTest, ReservedPagesNeverShowAnotherSessionsBytes) {
  const std::string victim = Attach("victim");
  v1::AllocateRequest req;
  *req.mutable_spec() = Spec(1, 2, 8);
  req.set_cache_id("secret");
  v1::AllocateResponse resp;
  ASSERT_TRUE(stub_->Allocate(Ctx(victim).get(), req, &resp).ok());
  ASSERT_TRUE(Append("secret", 0, 0, RandomTensor(v1::FLOAT32, 2, 16, 8, 7),
                     RandomTensor(v1::FLOAT32, 2, 16, 8, 8), victim)
                  .ok());
  v1::ReleaseRequest release;
  release.set_cache_id("secret");
  v1::ReleaseResponse released;
  ASSERT_TRUE(stub_->Release(Ctx(victim).get(), release, &released).ok());

  auto tcp = v1::KvCacheService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
  req.set_cache_id("reader");
  ASSERT_TRUE(tcp->Allocate(Ctx().get(), req, &resp).ok());
  v1::ReserveRequest reserve;
  v1::CacheTokens* item = reserve.add_items();
  item->set_cache_id("reader");
  item->set_tokens(16);
  v1::ReserveResponse reserved;
  ASSERT_TRUE(tcp->Reserve(Ctx().get(), reserve, &reserved).ok());
  v1::CommitRequest commit;
  *commit.add_items() = *item;
  v1::CommitResponse committed;
  ASSERT_TRUE(tcp->Commit(Ctx().get(), commit, &committed).ok());
  v1::GetKvRequest get;
  get.set_cache_id("reader");
  v1::GetKvResponse kv;
  ASSERT_TRUE(tcp->GetKv(Ctx().get(), get, &kv).ok());
  EXPECT_EQ(kv.k().data().size(), 16u * 2 * 8 * 4);
  EXPECT_EQ(kv.k().data(), std::string(kv.k().data().size(), '\0'));
  EXPECT_EQ(kv.v().data(), std::string(kv.v().data().size(), '\0'));
}

}  // namespace
}  // namespace kvarena
