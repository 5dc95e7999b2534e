// ExtremesTest: a real kvarenad with two small caches and two sessions, and a table
// runner for requests at the extremes of their types (extremes_*_test.cc). Each case
// gets its specific code and a short message, changes nothing a client can see (stats,
// description, every layer's K/V), and the daemon answers the next call.
#ifndef KVARENA_TESTS_DAEMON_EXTREMES_FIXTURE_H_
#define KVARENA_TESTS_DAEMON_EXTREMES_FIXTURE_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tests/daemon/rpc_test_util.h"

namespace kvarena {

inline constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
inline constexpr uint32_t kU32Max = std::numeric_limits<uint32_t>::max();
inline constexpr uint64_t k2To63 = uint64_t{1} << 63;
inline constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

struct ExtremesCase;

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

  // Runs the cases in turn; after each, the daemon must still answer and State() must be
  // as before the first.
  void RunCases(const std::vector<ExtremesCase>& cases);

  std::string session_;
  std::string other_;
};

// One request: what it is, and the code and message it must get.
struct ExtremesCase {
  const char* name;
  std::function<grpc::Status(ExtremesTest*)> call;
  grpc::StatusCode code;
  const char* message;  // a substring of the status message ("" for OK)
};

inline void ExtremesTest::RunCases(const std::vector<ExtremesCase>& cases) {
  const std::string before = State();
  for (const ExtremesCase& c : cases) {
    SCOPED_TRACE(c.name);
    const grpc::Status s = c.call(this);
    EXPECT_THAT(s, StatusIs(c.code, c.message));
    EXPECT_LT(s.error_message().size(), 400u) << "messages echo a short prefix of what was sent";
    v1::PingResponse pong;
    ASSERT_TRUE(stub_->Ping(Ctx().get(), v1::PingRequest(), &pong).ok()) << "the daemon died";
    EXPECT_EQ(State(), before);
  }
}

}  // namespace kvarena

#endif  // KVARENA_TESTS_DAEMON_EXTREMES_FIXTURE_H_
