// INVALID_ARGUMENT from every boundary check, each followed by a check that nothing
// changed, and that the message names the field and the numbers.
#include <limits>

#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using grpc::StatusCode;

class InvalidArgumentTest : public KvarenadTest {
 protected:
  // A float32 cache [2 layers, 2 kv heads, head_dim 8, page 4] holding 5 tokens on layer 0.
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(KvarenadTest::SetUp());
    id_ = Allocate(Spec(2, 2, 8));
    ASSERT_TRUE(AppendF32(id_, 0, 0, 5, 2, 8, 1).ok());
    before_ = Snapshot(id_);
  }
  void ExpectUnchanged() { EXPECT_EQ(Snapshot(id_), before_); }

  std::string id_;
  std::string before_;
};

TEST_F(InvalidArgumentTest, AllocateRejectsBadSpecFields) {
  struct Case {
    const char* name;
    void (*mutate)(v1::CacheSpec*);
    const char* message;
  };
  const Case kCases[] = {
      {"zero layers", [](v1::CacheSpec* s) { s->set_num_layers(0); }, "num_layers=0"},
      {"zero kv heads", [](v1::CacheSpec* s) { s->set_num_kv_heads(0); }, "num_kv_heads=0"},
      {"zero head_dim", [](v1::CacheSpec* s) { s->set_head_dim(0); }, "head_dim=0"},
      {"unspecified dtype", [](v1::CacheSpec* s) { s->set_dtype(v1::DTYPE_UNSPECIFIED); }, "dtype"},
      {"unknown kv_format", [](v1::CacheSpec* s) { s->set_kv_format(v1::KvFormat(99)); },
       "spec.kv_format=99 is not a KV format"},
      {"kv_format another dtype's",
       [](v1::CacheSpec* s) {
         s->set_dtype(v1::FLOAT32);
         s->set_kv_format(v1::KV_BFLOAT16);
       },
       "spec.kv_format=bfloat16 with spec.dtype=float32"},
      {"scales without fp8", [](v1::CacheSpec* s) { s->add_k_scales(1); },
       "spec.k_scales has 1 entries but spec.kv_format=float32 takes no static scales"},
      {"fp8 scales count",
       [](v1::CacheSpec* s) {
         s->set_kv_format(v1::KV_FP8_E4M3);
         for (int i = 0; i < 3; ++i) s->add_v_scales(1);
       },
       "spec.v_scales has 3 entries; want 0 or num_layers * num_kv_heads = 2 * 2 = 4"},
      {"fp8 scale zero",
       [](v1::CacheSpec* s) {
         s->set_kv_format(v1::KV_FP8_E4M3);
         for (float x : {1.0f, 2.0f, 0.0f, 1.0f}) s->add_k_scales(x);
       },
       "spec.k_scales[2]=0 must be a finite, normal float32 > 0"},
      {"fp8 scale NaN",
       [](v1::CacheSpec* s) {
         s->set_kv_format(v1::KV_FP8_E4M3);
         for (float x : {1.0f, 2.0f, 3.0f, std::numeric_limits<float>::quiet_NaN()}) {
           s->add_k_scales(x);
         }
       },
       "spec.k_scales[3]=nan"},
      {"fp8 scale infinite",
       [](v1::CacheSpec* s) {
         s->set_kv_format(v1::KV_FP8_E4M3);
         for (float x : {-1.0f, 2.0f, 3.0f, 4.0f}) s->add_k_scales(x);
         for (float x : {1.0f, std::numeric_limits<float>::infinity(), 3.0f, 4.0f}) {
           s->add_v_scales(x);
         }
       },
       "spec.k_scales[0]=-1"},
      {"fp8 scale subnormal",
       [](v1::CacheSpec* s) {
         s->set_kv_format(v1::KV_FP8_E4M3);
         for (float x : {1.0f, 1e-45f, 3.0f, 4.0f}) s->add_v_scales(x);
       },
       "spec.v_scales[1]=1.4013e-45"},
      {"windows length", [](v1::CacheSpec* s) { s->add_layer_windows(0); },
       "layer_windows has 1 entries but num_layers=2"},
      {"window 1",
       [](v1::CacheSpec* s) {
         s->add_layer_windows(0);
         s->add_layer_windows(1);
       },
       "layer_windows[1]=1"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    v1::AllocateRequest req;
    *req.mutable_spec() = Spec(2, 2, 8);
    c.mutate(req.mutable_spec());
    v1::AllocateResponse resp;
    EXPECT_THAT(stub_->Allocate(Ctx().get(), req, &resp),
                StatusIs(StatusCode::INVALID_ARGUMENT, c.message));
    v1::ListCachesResponse caches;
    ASSERT_TRUE(stub_->ListCaches(Ctx().get(), v1::ListCachesRequest(), &caches).ok());
    EXPECT_EQ(caches.caches_size(), 1);
    ExpectUnchanged();
  }
}

TEST_F(InvalidArgumentTest, AppendRejectsWrongDtype) {
  EXPECT_THAT(Append(id_, 0, 5, RandomTensor(v1::FLOAT16, 2, 1, 8, 1),
                     RandomTensor(v1::FLOAT16, 2, 1, 8, 2)),
              StatusIs(StatusCode::INVALID_ARGUMENT, "k.dtype=float16"));
  ExpectUnchanged();
}

TEST_F(InvalidArgumentTest, AppendRejectsWrongShape) {
  EXPECT_THAT(Append(id_, 0, 5, F32Tensor(3, 1, 8, 1), F32Tensor(3, 1, 8, 2)),
              StatusIs(StatusCode::INVALID_ARGUMENT, "k.shape=[1, 3, 1, 8] must be [1, 2,"));
  ExpectUnchanged();
}

TEST_F(InvalidArgumentTest, AppendRejectsByteCountMismatch) {
  v1::Tensor v = F32Tensor(2, 1, 8, 2);
  v.mutable_data()->resize(v.data().size() - 4);
  EXPECT_THAT(Append(id_, 0, 5, F32Tensor(2, 1, 8, 1), v),
              StatusIs(StatusCode::INVALID_ARGUMENT, "v has 60 bytes"));
  ExpectUnchanged();
}

TEST_F(InvalidArgumentTest, AppendRejectsMissingPayload) {
  v1::Tensor k = F32Tensor(2, 1, 8, 1);
  k.clear_payload();
  EXPECT_THAT(Append(id_, 0, 5, k, F32Tensor(2, 1, 8, 2)),
              StatusIs(StatusCode::INVALID_ARGUMENT, "k has 0 bytes"));
  ExpectUnchanged();
}

TEST_F(InvalidArgumentTest, AppendRejectsBadLayer) {
  EXPECT_THAT(AppendF32(id_, 2, 0, 1, 2, 8, 1),
              StatusIs(StatusCode::INVALID_ARGUMENT, "layer=2 but the cache has num_layers=2"));
  ExpectUnchanged();
}

TEST_F(InvalidArgumentTest, AppendRejectsPosGap) {
  EXPECT_THAT(AppendF32(id_, 0, 7, 1, 2, 8, 1),
              StatusIs(StatusCode::INVALID_ARGUMENT, "pos=7 but layer 0 holds 5 tokens"));
  ExpectUnchanged();
}

TEST_F(InvalidArgumentTest, AttendRejectsQHeadsNotMultipleOfKvHeads) {
  v1::AttendRequest req;
  req.set_cache_id(id_);
  req.set_pos(4);
  *req.mutable_q() = F32Tensor(3, 1, 8, 1);
  v1::AttendResponse resp;
  EXPECT_THAT(stub_->Attend(Ctx().get(), req, &resp),
              StatusIs(StatusCode::INVALID_ARGUMENT, "multiple of num_kv_heads=2"));
  ExpectUnchanged();
}

TEST_F(InvalidArgumentTest, AttendOverCachedRejectsPositionsNotYetWritten) {
  v1::AttendRequest req;
  req.set_cache_id(id_);
  req.set_pos(4);
  *req.mutable_q() = F32Tensor(2, 2, 8, 1);
  v1::AttendResponse resp;
  EXPECT_THAT(stub_->Attend(Ctx().get(), req, &resp),
              StatusIs(StatusCode::INVALID_ARGUMENT, "pos=4 with 2 queries"));
  ExpectUnchanged();
}

TEST_F(InvalidArgumentTest, AttendWithKvRejectsPosGapBeforeAppending) {
  v1::AttendRequest req;
  req.set_cache_id(id_);
  req.set_pos(6);
  *req.mutable_q() = F32Tensor(2, 1, 8, 1);
  *req.mutable_k() = F32Tensor(2, 1, 8, 2);
  *req.mutable_v() = F32Tensor(2, 1, 8, 3);
  v1::AttendResponse resp;
  EXPECT_THAT(stub_->Attend(Ctx().get(), req, &resp),
              StatusIs(StatusCode::INVALID_ARGUMENT, "pos=6 but layer 0 holds 5"));
  ExpectUnchanged();
}

TEST_F(InvalidArgumentTest, GetKvRejectsBadLayer) {
  v1::GetKvRequest req;
  req.set_cache_id(id_);
  req.set_layer(9);
  v1::GetKvResponse resp;
  EXPECT_THAT(stub_->GetKv(Ctx().get(), req, &resp),
              StatusIs(StatusCode::INVALID_ARGUMENT, "layer=9"));
  ExpectUnchanged();
}

// Shared slices live in a session's scratch region (tests/zerocopy covers them served);
// a call without a session has none to name.
TEST_F(InvalidArgumentTest, SharedSlicesWithoutASessionAreRefused) {
  v1::AttendRequest req;
  req.set_cache_id(id_);
  req.set_pos(4);
  *req.mutable_q() = F32Tensor(2, 1, 8, 1);
  req.mutable_out()->set_region_id(1);
  v1::AttendResponse resp;
  EXPECT_THAT(stub_->Attend(Ctx().get(), req, &resp),
              StatusIs(StatusCode::FAILED_PRECONDITION, "attend: out: shared slice"));
  v1::Tensor shared = F32Tensor(2, 1, 8, 1);
  shared.mutable_shared()->set_region_id(1);
  EXPECT_THAT(Append(id_, 0, 5, shared, shared),
              StatusIs(StatusCode::FAILED_PRECONDITION, "append: k: shared slice"));
  ExpectUnchanged();
}

}  // namespace
}  // namespace kvarena
