// Every KvCacheService RPC's success path against a real kvarenad.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "tests/daemon/rpc_test_util.h"

namespace kvarena {
namespace {

using ::testing::ElementsAre;
using ::testing::SizeIs;

class RpcTest : public KvarenadTest {};

TEST_F(RpcTest, AllocateResolvesDefaults) {
  v1::AllocateRequest req;
  *req.mutable_spec() = Spec(3, 2, 8, v1::FLOAT16, /*page_size=*/0);
  v1::AllocateResponse resp;
  ASSERT_TRUE(stub_->Allocate(Ctx().get(), req, &resp).ok());
  const v1::CacheInfo& c = resp.cache();
  EXPECT_FALSE(c.cache_id().empty());
  EXPECT_EQ(c.spec().page_size(), 16u);  // the daemon's --page_size
  EXPECT_THAT(c.spec().layer_windows(), ElementsAre(0, 0, 0));
  EXPECT_EQ(c.seq_len(), 0u);
  EXPECT_EQ(c.page_bytes(), 2u * 16 * 2 * 8 * 2);
}

TEST_F(RpcTest, AllocateKeepsTheCallersId) {
  v1::AllocateRequest req;
  *req.mutable_spec() = Spec(1, 1, 4);
  req.set_cache_id("seq-42");
  v1::AllocateResponse resp;
  ASSERT_TRUE(stub_->Allocate(Ctx().get(), req, &resp).ok());
  EXPECT_EQ(resp.cache().cache_id(), "seq-42");
}

TEST_F(RpcTest, AppendAdvancesLayerAndSeqLen) {
  const std::string id = Allocate(Spec(2, 2, 8));
  v1::AppendResponse resp;
  ASSERT_TRUE(Append(id, 1, 0, F32Tensor(2, 5, 8, 1), F32Tensor(2, 5, 8, 2), "", &resp).ok());
  EXPECT_EQ(resp.layer_len(), 5u);
  EXPECT_EQ(resp.seq_len(), 5u);
  ASSERT_TRUE(Append(id, 1, 5, F32Tensor(2, 1, 8, 3), F32Tensor(2, 1, 8, 4), "", &resp).ok());
  EXPECT_EQ(resp.layer_len(), 6u);
  EXPECT_THAT(Describe(id).cache().layer_lens(), ElementsAre(0, 6));
}

TEST_F(RpcTest, GetKvRoundTripsBitExactInEveryDtype) {
  for (v1::DType dtype : {v1::FLOAT32, v1::FLOAT16, v1::BFLOAT16}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    const std::string id = Allocate(Spec(2, 3, 16, dtype, 4));
    const v1::Tensor k = RandomTensor(dtype, 3, 7, 16, 11), v = RandomTensor(dtype, 3, 7, 16, 12);
    ASSERT_THAT(Append(id, 0, 0, SliceTokens(k, 0, 5), SliceTokens(v, 0, 5)),
                StatusIs(grpc::StatusCode::OK));
    ASSERT_THAT(Append(id, 0, 5, SliceTokens(k, 5, 2), SliceTokens(v, 5, 2)),
                StatusIs(grpc::StatusCode::OK));
    const v1::GetKvResponse got = GetKv(id, 0);
    EXPECT_EQ(got.first_pos(), 0u);
    EXPECT_THAT(got.k().shape(), ElementsAre(1, 3, 7, 16));
    EXPECT_EQ(got.k().dtype(), dtype);
    EXPECT_TRUE(got.k().data() == k.data()) << "K differs";
    EXPECT_TRUE(got.v().data() == v.data()) << "V differs";
  }
}

TEST_F(RpcTest, GetKvOfSlidingLayerReturnsRetainedTail) {
  v1::CacheSpec spec = Spec(1, 1, 4, v1::FLOAT32, 4);
  spec.add_layer_windows(4);
  const std::string id = Allocate(spec);
  const v1::Tensor k = RandomTensor(v1::FLOAT32, 1, 12, 4, 1);
  const v1::Tensor v = RandomTensor(v1::FLOAT32, 1, 12, 4, 2);
  for (int t = 0; t < 12; ++t) {
    ASSERT_TRUE(Append(id, 0, t, SliceTokens(k, t, 1), SliceTokens(v, t, 1)).ok());
  }
  const v1::GetKvResponse got = GetKv(id, 0);
  ASSERT_GT(got.first_pos(), 0u);
  ASSERT_EQ(got.first_pos() % 4, 0u);
  const int64_t kept = 12 - int64_t(got.first_pos());
  EXPECT_THAT(got.k().shape(), ElementsAre(1, 1, kept, 4));
  EXPECT_TRUE(got.k().data() == SliceTokens(k, got.first_pos(), kept).data());
  EXPECT_GT(Stats(id).pages().pages_evicted(), 0u);
}

TEST_F(RpcTest, AttendWithKvAppendsAndMatchesReference) {
  constexpr int kKv = 2, kQ = 4, kDim = 8;
  const std::string id = Allocate(Spec(1, kKv, kDim));
  const v1::Tensor k = F32Tensor(kKv, 7, kDim, 1), v = F32Tensor(kKv, 7, kDim, 2);
  ASSERT_TRUE(Append(id, 0, 0, SliceTokens(k, 0, 5), SliceTokens(v, 0, 5)).ok());

  v1::AttendRequest req;
  req.set_cache_id(id);
  req.set_pos(5);
  *req.mutable_q() = F32Tensor(kQ, 2, kDim, 3);
  *req.mutable_k() = SliceTokens(k, 5, 2);
  *req.mutable_v() = SliceTokens(v, 5, 2);
  v1::AttendResponse resp;
  ASSERT_TRUE(stub_->Attend(Ctx().get(), req, &resp).ok());
  EXPECT_EQ(resp.seq_len(), 7u);
  EXPECT_THAT(resp.out().shape(), ElementsAre(1, kQ, 2, kDim));
  EXPECT_EQ(resp.out().dtype(), v1::FLOAT32);
  const std::vector<float> want = ReferenceAttention(
      FloatsOf(req.q()), kQ, 2, FloatsOf(k), FloatsOf(v), kKv, 7, kDim, 5, 1 / std::sqrt(8.0));
  const std::vector<float> got = FloatsOf(resp.out());
  ASSERT_THAT(got, SizeIs(want.size()));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  EXPECT_TRUE(GetKv(id, 0).k().data() == k.data());
}

TEST_F(RpcTest, AttendOverCachedMatchesReference) {
  constexpr int kKv = 2, kQ = 2, kDim = 8;
  const std::string id = Allocate(Spec(1, kKv, kDim));
  const v1::Tensor k = F32Tensor(kKv, 9, kDim, 4), v = F32Tensor(kKv, 9, kDim, 5);
  ASSERT_TRUE(Append(id, 0, 0, k, v).ok());

  v1::AttendRequest req;
  req.set_cache_id(id);
  req.set_pos(3);
  req.set_scale(0.25);
  *req.mutable_q() = F32Tensor(kQ, 3, kDim, 6);
  v1::AttendResponse resp;
  ASSERT_TRUE(stub_->Attend(Ctx().get(), req, &resp).ok());
  EXPECT_EQ(resp.seq_len(), 9u);
  const std::vector<float> want =
      ReferenceAttention(FloatsOf(req.q()), kQ, 3, FloatsOf(k), FloatsOf(v), kKv, 9, kDim, 3, 0.25);
  const std::vector<float> got = FloatsOf(resp.out());
  ASSERT_THAT(got, SizeIs(want.size()));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
}

TEST_F(RpcTest, PopnRollsBackAndFreesTrailingPages) {
  const std::string id = Allocate(Spec(2, 1, 4));
  ASSERT_TRUE(AppendF32(id, 0, 0, 9, 1, 4, 1).ok());
  ASSERT_TRUE(AppendF32(id, 1, 0, 9, 1, 4, 2).ok());
  EXPECT_EQ(Stats(id).pages().pages_used(), 6u);  // 3 pages of 4 tokens per layer

  v1::PopnRequest req;
  req.set_cache_id(id);
  req.set_n(5);
  v1::PopnResponse resp;
  ASSERT_TRUE(stub_->Popn(Ctx().get(), req, &resp).ok());
  EXPECT_EQ(resp.popped(), 5u);
  EXPECT_EQ(resp.seq_len(), 4u);
  EXPECT_EQ(resp.refusal(), "");
  EXPECT_EQ(Stats(id).pages().pages_used(), 2u);
  EXPECT_THAT(Describe(id).cache().layer_lens(), ElementsAre(4, 4));
}

TEST_F(RpcTest, PopnRefusesMoreThanSeqLenAndChangesNothing) {
  const std::string id = Allocate(Spec(1, 1, 4));
  ASSERT_TRUE(AppendF32(id, 0, 0, 3, 1, 4, 1).ok());
  const std::string before = Snapshot(id);
  v1::PopnRequest req;
  req.set_cache_id(id);
  req.set_n(4);
  v1::PopnResponse resp;
  ASSERT_TRUE(stub_->Popn(Ctx().get(), req, &resp).ok());
  EXPECT_EQ(resp.popped(), 0u);
  EXPECT_EQ(resp.seq_len(), 3u);
  EXPECT_THAT(resp.refusal(), ::testing::HasSubstr("n=4"));
  EXPECT_EQ(Snapshot(id), before);
}

TEST_F(RpcTest, PopnRefusesWhenSlidingLayerEvictedTheTokens) {
  v1::CacheSpec spec = Spec(2, 1, 4, v1::FLOAT32, 2);
  spec.add_layer_windows(0);
  spec.add_layer_windows(3);
  const std::string id = Allocate(spec);
  ASSERT_TRUE(AppendF32(id, 0, 0, 12, 1, 4, 1).ok());
  ASSERT_TRUE(AppendF32(id, 1, 0, 11, 1, 4, 2).ok());
  ASSERT_TRUE(AppendF32(id, 1, 11, 1, 1, 4, 3).ok());  // evicts below 11 - 3 + 1
  ASSERT_GT(Stats(id).pages().pages_evicted(), 0u);
  const std::string before = Snapshot(id);
  v1::PopnRequest req;
  req.set_cache_id(id);
  req.set_n(11);
  v1::PopnResponse resp;
  ASSERT_TRUE(stub_->Popn(Ctx().get(), req, &resp).ok());
  EXPECT_EQ(resp.popped(), 0u);
  EXPECT_FALSE(resp.refusal().empty());
  EXPECT_EQ(Snapshot(id), before);
}

TEST_F(RpcTest, ResetKeepPagesKeepsThemReserved) {
  const std::string id = Allocate(Spec(1, 1, 4));
  ASSERT_TRUE(AppendF32(id, 0, 0, 8, 1, 4, 1).ok());
  v1::ResetRequest req;
  req.set_cache_id(id);
  req.set_keep_pages(true);
  v1::ResetResponse resp;
  ASSERT_TRUE(stub_->Reset(Ctx().get(), req, &resp).ok());
  EXPECT_EQ(resp.cache().seq_len(), 0u);
  EXPECT_EQ(Stats(id).pages().pages_used(), 2u);
  EXPECT_EQ(Stats().pages().pages_used(), 2u);
  ASSERT_TRUE(AppendF32(id, 0, 0, 8, 1, 4, 2).ok());  // reuses them
  EXPECT_EQ(Stats().pages().pages_used(), 2u);
}

TEST_F(RpcTest, ResetWithoutKeepPagesFreesThem) {
  const std::string id = Allocate(Spec(1, 1, 4));
  ASSERT_TRUE(AppendF32(id, 0, 0, 8, 1, 4, 1).ok());
  v1::ResetRequest req;
  req.set_cache_id(id);
  v1::ResetResponse resp;
  ASSERT_TRUE(stub_->Reset(Ctx().get(), req, &resp).ok());
  EXPECT_EQ(resp.cache().seq_len(), 0u);
  EXPECT_EQ(Stats(id).pages().pages_used(), 0u);
  EXPECT_EQ(Stats().pages().pages_used(), 0u);
}

TEST_F(RpcTest, ReleaseFreesPagesAndForgetsTheCache) {
  const std::string id = Allocate(Spec(1, 1, 4));
  ASSERT_TRUE(AppendF32(id, 0, 0, 8, 1, 4, 1).ok());
  v1::ReleaseRequest req;
  req.set_cache_id(id);
  v1::ReleaseResponse resp;
  ASSERT_TRUE(stub_->Release(Ctx().get(), req, &resp).ok());
  EXPECT_EQ(Stats().pages().pages_used(), 0u);
  EXPECT_EQ(Stats().num_caches(), 0u);
  v1::StatsRequest stats;
  stats.set_cache_id(id);
  v1::StatsResponse ignored;
  EXPECT_THAT(stub_->Stats(Ctx().get(), stats, &ignored), StatusIs(grpc::StatusCode::NOT_FOUND));
}

TEST_F(RpcTest, DescribeListsEachLayersPages) {
  const std::string id = Allocate(Spec(2, 1, 4));
  ASSERT_TRUE(AppendF32(id, 1, 0, 6, 1, 4, 1).ok());
  const v1::DescribeResponse d = Describe(id);
  EXPECT_EQ(d.cache().cache_id(), id);
  EXPECT_EQ(d.cache().seq_len(), 6u);
  ASSERT_THAT(d.layers(), SizeIs(2));
  EXPECT_EQ(d.layers(0).layer(), 0u);
  EXPECT_THAT(d.layers(0).page_ids(), SizeIs(0));  // lazy: never written
  EXPECT_EQ(d.layers(1).layer(), 1u);
  EXPECT_EQ(d.layers(1).len(), 6u);
  EXPECT_EQ(d.layers(1).first_pos(), 0u);
  EXPECT_THAT(d.layers(1).page_ids(), SizeIs(2));
}

TEST_F(RpcTest, StatsTotalsTheArenaAndDescribesOneCache) {
  const std::string a = Allocate(Spec(2, 1, 4));
  const std::string b = Allocate(Spec(1, 2, 8, v1::FLOAT16));
  ASSERT_TRUE(AppendF32(a, 0, 0, 5, 1, 4, 1).ok());
  ASSERT_TRUE(
      Append(b, 0, 0, RandomTensor(v1::FLOAT16, 2, 3, 8, 1), RandomTensor(v1::FLOAT16, 2, 3, 8, 2))
          .ok());

  const v1::StatsResponse arena = Stats();
  EXPECT_EQ(arena.backend(), "host");
  EXPECT_EQ(arena.arena_bytes(), 64u << 20);
  EXPECT_EQ(arena.num_caches(), 2u);
  EXPECT_EQ(arena.pages().pages_used(), 3u);
  EXPECT_EQ(arena.pages().seq_len(), 8u);
  EXPECT_EQ(arena.pages().num_pages(), arena.pages().pages_used() + arena.pages().pages_free());
  EXPECT_THAT(arena.pools(), SizeIs(2));
  EXPECT_GT(arena.bytes_committed(), 0u);

  const v1::StatsResponse one = Stats(a);
  EXPECT_EQ(one.pages().pages_used(), 2u);
  EXPECT_EQ(one.pages().seq_len(), 5u);
  EXPECT_EQ(one.pages().page_size(), 4u);
  EXPECT_EQ(one.pages().layers_total(), 2u);
  EXPECT_EQ(one.pages().layers_materialized(), 1u);
  EXPECT_THAT(one.pools(), SizeIs(0));
}

TEST_F(RpcTest, ListCachesListsEveryCache) {
  const std::string a = Allocate(Spec(1, 1, 4));
  const std::string b = Allocate(Spec(2, 1, 4));
  v1::ListCachesResponse resp;
  ASSERT_TRUE(stub_->ListCaches(Ctx().get(), v1::ListCachesRequest(), &resp).ok());
  std::vector<std::string> ids;
  for (const v1::CacheInfo& c : resp.caches()) ids.push_back(c.cache_id());
  EXPECT_THAT(ids, ::testing::UnorderedElementsAre(a, b));
}

// 25 caches in pages of 10: three pages, every cache exactly once, in id order; the
// last page gives no token; a token no page gave is INVALID_ARGUMENT.
TEST_F(RpcTest, ListCachesPagesThroughEveryCacheOnce) {
  std::set<std::string> made;
  for (int i = 0; i < 25; ++i) made.insert(Allocate(Spec(1, 1, 4)));
  std::vector<std::string> listed;
  v1::ListCachesRequest req;
  req.set_page_size(10);
  int pages = 0;
  do {
    v1::ListCachesResponse resp;
    ASSERT_TRUE(stub_->ListCaches(Ctx().get(), req, &resp).ok());
    ++pages;
    EXPECT_EQ(resp.caches_size(), pages < 3 ? 10 : 5);
    for (const v1::CacheInfo& c : resp.caches()) listed.push_back(c.cache_id());
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_TRUE(std::is_sorted(listed.begin(), listed.end()));
  EXPECT_EQ(std::set<std::string>(listed.begin(), listed.end()), made);
  EXPECT_EQ(listed.size(), made.size());
  // page_size 0: the default page (1000) holds them all.
  v1::ListCachesResponse all;
  ASSERT_TRUE(stub_->ListCaches(Ctx().get(), v1::ListCachesRequest(), &all).ok());
  EXPECT_EQ(all.caches_size(), 25);
  EXPECT_EQ(all.next_page_token(), "");
  for (const std::string& bad :
       {std::string("not a token"), std::string("YWZ0ZXI6"), *made.begin()}) {
    SCOPED_TRACE(bad);
    v1::ListCachesRequest r;
    r.set_page_token(bad);
    v1::ListCachesResponse resp;
    EXPECT_THAT(stub_->ListCaches(Ctx().get(), r, &resp),
                StatusIs(grpc::StatusCode::INVALID_ARGUMENT, "page_token"));
  }
}

TEST_F(RpcTest, ReserveAndCommitAdvanceEveryLayer) {
  const std::string id = Allocate(Spec(2, 1, 4));
  v1::ReserveRequest reserve;
  v1::CacheTokens* item = reserve.add_items();
  item->set_cache_id(id);
  item->set_tokens(6);
  v1::ReserveResponse reserved;
  const grpc::Status s = stub_->Reserve(Ctx().get(), reserve, &reserved);
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED)
    GTEST_SKIP() << "core: " << s.error_message();
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_THAT(reserved.caches(), SizeIs(1));
  EXPECT_EQ(reserved.caches(0).first_pos(), 0u);
  ASSERT_THAT(reserved.caches(0).layers(), SizeIs(2));
  EXPECT_THAT(reserved.caches(0).layers(1).page_ids(), SizeIs(2));

  v1::CommitRequest commit;
  *commit.add_items() = *item;
  v1::CommitResponse committed;
  ASSERT_TRUE(stub_->Commit(Ctx().get(), commit, &committed).ok());
  ASSERT_THAT(committed.caches(), SizeIs(1));
  EXPECT_EQ(committed.caches(0).seq_len(), 6u);
  EXPECT_THAT(Describe(id).cache().layer_lens(), ElementsAre(6, 6));
  EXPECT_EQ(Stats(id).pages().pages_used(), 4u);
}

TEST_F(RpcTest, PingAnswers) {
  v1::PingResponse resp;
  EXPECT_TRUE(stub_->Ping(Ctx().get(), v1::PingRequest(), &resp).ok());
}

}  // namespace
}  // namespace kvarena
