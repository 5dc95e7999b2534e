// NOT_FOUND, RESOURCE_EXHAUSTED, FAILED_PRECONDITION and ALREADY_EXISTS through the wire,
// each rejection followed by a check that nothing changed.
#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using grpc::StatusCode;

class StatusTest : public KvarenadTest {};

TEST_F(StatusTest, EveryCacheRpcReturnsNotFoundForAnUnknownCache) {
  const std::string id = Allocate(Spec(1, 1, 4));
  const std::string before = Snapshot(id);
  const std::string missing = "no-such-cache";
  v1::AppendResponse append;
  EXPECT_THAT(AppendF32(missing, 0, 0, 1, 1, 4, 1), StatusIs(StatusCode::NOT_FOUND, missing));
  v1::AttendRequest attend;
  attend.set_cache_id(missing);
  *attend.mutable_q() = F32Tensor(1, 1, 4, 1);
  v1::AttendResponse attended;
  EXPECT_THAT(stub_->Attend(Ctx().get(), attend, &attended),
              StatusIs(StatusCode::NOT_FOUND, missing));
  v1::PopnRequest popn;
  popn.set_cache_id(missing);
  popn.set_n(1);
  v1::PopnResponse popped;
  EXPECT_THAT(stub_->Popn(Ctx().get(), popn, &popped), StatusIs(StatusCode::NOT_FOUND, missing));
  v1::ResetRequest reset;
  reset.set_cache_id(missing);
  v1::ResetResponse was_reset;
  EXPECT_THAT(stub_->Reset(Ctx().get(), reset, &was_reset),
              StatusIs(StatusCode::NOT_FOUND, missing));
  v1::ReleaseRequest release;
  release.set_cache_id(missing);
  v1::ReleaseResponse released;
  EXPECT_THAT(stub_->Release(Ctx().get(), release, &released),
              StatusIs(StatusCode::NOT_FOUND, missing));
  v1::GetKvRequest get;
  get.set_cache_id(missing);
  v1::GetKvResponse got;
  EXPECT_THAT(stub_->GetKv(Ctx().get(), get, &got), StatusIs(StatusCode::NOT_FOUND, missing));
  v1::DescribeRequest describe;
  describe.set_cache_id(missing);
  v1::DescribeResponse described;
  EXPECT_THAT(stub_->Describe(Ctx().get(), describe, &described),
              StatusIs(StatusCode::NOT_FOUND, missing));
  v1::StatsRequest stats;
  stats.set_cache_id(missing);
  v1::StatsResponse stated;
  EXPECT_THAT(stub_->Stats(Ctx().get(), stats, &stated), StatusIs(StatusCode::NOT_FOUND, missing));
  EXPECT_EQ(Snapshot(id), before);
}

TEST_F(StatusTest, AppendPastMaxTokensIsResourceExhausted) {
  v1::CacheSpec spec = Spec(1, 1, 4);
  spec.set_max_tokens(6);
  const std::string id = Allocate(spec);
  ASSERT_TRUE(AppendF32(id, 0, 0, 4, 1, 4, 1).ok());
  const std::string before = Snapshot(id);
  EXPECT_THAT(AppendF32(id, 0, 4, 3, 1, 4, 2),
              StatusIs(StatusCode::RESOURCE_EXHAUSTED, "would hold 7 tokens but max_tokens=6"));
  EXPECT_EQ(Snapshot(id), before);
  EXPECT_TRUE(AppendF32(id, 0, 4, 2, 1, 4, 2).ok());
}

TEST_F(StatusTest, AppendIntoAFullArenaIsResourceExhausted) {
  StartDaemon({"--arena_bytes=2Mi"});
  // 128 KiB pages: [2][16 tokens][8 heads][128] float32; a 2 MiB arena holds 16 of them.
  const v1::CacheSpec spec = Spec(1, 8, 128, v1::FLOAT32, 16);
  const std::string id = Allocate(spec);
  const std::string other = Allocate(spec);
  ASSERT_TRUE(AppendF32(id, 0, 0, 15 * 16, 8, 128, 1).ok());
  ASSERT_EQ(Stats().pages().pages_free(), 1u);
  const std::string before = Snapshot(id);
  const std::string before_other = Snapshot(other);
  EXPECT_THAT(AppendF32(other, 0, 0, 2 * 16, 8, 128, 2),
              StatusIs(StatusCode::RESOURCE_EXHAUSTED, "layer 0"));
  EXPECT_EQ(Snapshot(id), before);
  EXPECT_EQ(Snapshot(other), before_other);
  EXPECT_TRUE(AppendF32(other, 0, 0, 16, 8, 128, 2).ok());  // the last page still fits
}

TEST_F(StatusTest, AttendOverEvictedKeysIsFailedPrecondition) {
  v1::CacheSpec spec = Spec(1, 1, 4, v1::FLOAT32, 2);
  spec.add_layer_windows(3);
  const std::string id = Allocate(spec);
  ASSERT_TRUE(AppendF32(id, 0, 0, 11, 1, 4, 1).ok());
  ASSERT_TRUE(AppendF32(id, 0, 11, 1, 1, 4, 2).ok());  // evicts below 11 - 3 + 1
  const std::string before = Snapshot(id);
  v1::AttendRequest req;
  req.set_cache_id(id);
  req.set_pos(1);
  *req.mutable_q() = F32Tensor(1, 1, 4, 1);
  v1::AttendResponse resp;
  EXPECT_THAT(stub_->Attend(Ctx().get(), req, &resp),
              StatusIs(StatusCode::FAILED_PRECONDITION, "pos=1"));
  EXPECT_EQ(Snapshot(id), before);
}

TEST_F(StatusTest, UnknownSessionIsFailedPrecondition) {
  const std::string id = Allocate(Spec(1, 1, 4));
  const std::string before = Snapshot(id);
  EXPECT_THAT(AppendF32(id, 0, 0, 1, 1, 4, 1, "not-a-session"),
              StatusIs(StatusCode::FAILED_PRECONDITION, "session"));
  v1::AllocateRequest req;
  *req.mutable_spec() = Spec(1, 1, 4);
  v1::AllocateResponse resp;
  EXPECT_THAT(stub_->Allocate(Ctx("not-a-session").get(), req, &resp),
              StatusIs(StatusCode::FAILED_PRECONDITION));
  EXPECT_EQ(Snapshot(id), before);
}

TEST_F(StatusTest, AllocateWithAnIdInUseIsAlreadyExists) {
  v1::AllocateRequest req;
  *req.mutable_spec() = Spec(1, 1, 4);
  req.set_cache_id("taken");
  v1::AllocateResponse resp;
  ASSERT_TRUE(stub_->Allocate(Ctx().get(), req, &resp).ok());
  ASSERT_TRUE(AppendF32("taken", 0, 0, 3, 1, 4, 1).ok());
  const std::string before = Snapshot("taken");
  EXPECT_THAT(stub_->Allocate(Ctx().get(), req, &resp),
              StatusIs(StatusCode::ALREADY_EXISTS, "'taken'"));
  EXPECT_EQ(Snapshot("taken"), before);
}

}  // namespace
}  // namespace kvarena
