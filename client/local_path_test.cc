// The local path (reserve -> append_local / attention_local -> commit) against "inproc:":
// the same kernels as the served path over the same pool, one Reserve per page boundary,
// the handle's own block table following windows, popn and reset.
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvarena/client.h"
#include "tests/support/inproc_fixture.h"
#include "tests/support/kv_history.h"
#include "tests/support/status_matchers.h"

namespace kvarena {
namespace {

using testing::HostTensor;
using testing::IsOk;
using testing::KvHistory;
using testing::StatusIs;

constexpr int kKvHeads = 2;
constexpr int kQHeads = 4;
constexpr int kHeadDim = 16;
constexpr int kPageSize = 4;

class LocalPathTest : public testing::InprocClientFixture<> {
 protected:
  std::shared_ptr<GenericKvCacheHandle> Allocate(std::vector<int> windows, int64_t max_tokens = 0) {
    CacheSpec spec =
        testing::MakeSpec(int(windows.size()), kKvHeads, kHeadDim, DType::kFloat16, kPageSize);
    spec.layer_windows = std::move(windows);
    spec.max_tokens = max_tokens;
    return NewCache(spec);
  }
  HostTensor Random(int heads, int64_t n) {
    return testing::RandomTensor(rng_, DType::kFloat16, heads, n, kHeadDim);
  }

  // One step of n tokens on `local` (local path) and `served` (attention RPCs) with the
  // same q/k/v: outputs must be bit-identical and match the float64 reference.
  void Step(GenericKvCacheHandle& local, GenericKvCacheHandle& served,
            std::vector<KvHistory>& history, int64_t n) {
    ASSERT_THAT(local.reserve(n), IsOk());
    for (int layer = 0; layer < local.num_layers(); ++layer) {
      SCOPED_TRACE(layer);
      const int64_t pos = history[layer].len();
      HostTensor q = Random(kQHeads, n), k = Random(kKvHeads, n), v = Random(kKvHeads, n);
      auto a = local.attention_local(layer, q.arg(), k.arg(), v.arg());
      auto b = served.attention(layer, q.arg(), k.arg(), v.arg());
      ASSERT_THAT(a, IsOk());
      ASSERT_THAT(b, IsOk());
      EXPECT_EQ(a->data, b->data);
      EXPECT_EQ(a->shape, q.shape);
      history[layer].Append(k, v);
      EXPECT_THAT(
          testing::CompareOutput("local", *a,
                                 history[layer].Attention(q, pos, 0, local.layer_windows()[layer])),
          IsOk());
    }
    ASSERT_THAT(local.commit(n), IsOk());
  }
  void ExpectSameKv(GenericKvCacheHandle& a, GenericKvCacheHandle& b) {
    for (int layer = 0; layer < a.num_layers(); ++layer) {
      auto x = a.get_kv(layer), y = b.get_kv(layer);
      ASSERT_THAT(x, IsOk());
      ASSERT_THAT(y, IsOk());
      EXPECT_EQ(x->first_pos, y->first_pos) << layer;
      EXPECT_EQ(x->k.data, y->k.data) << layer;
      EXPECT_EQ(x->v.data, y->v.data) << layer;
      auto mapped = a.get_kv_local(layer);  // the same bytes, read through the mapping
      ASSERT_THAT(mapped, IsOk());
      EXPECT_EQ(mapped->first_pos, x->first_pos) << layer;
      EXPECT_EQ(mapped->k.shape, x->k.shape) << layer;
      EXPECT_EQ(mapped->k.data, x->k.data) << layer;
      EXPECT_EQ(mapped->v.data, x->v.data) << layer;
    }
  }

  std::mt19937_64 rng_{7};
};

TEST_F(LocalPathTest, DecodeMatchesServedPathWithOneReservePerPage) {
  const std::vector<int> windows = {0, 6, 0};
  auto local = Allocate(windows), served = Allocate(windows);
  std::vector<KvHistory> history(3, KvHistory(kKvHeads, kHeadDim));
  Step(*local, *served, history, 5);  // prefill
  const CallCounts before = client_->call_counts();
  const int steps = 23;
  for (int i = 0; i < steps; ++i) Step(*local, *served, history, 1);
  const CallCounts after = client_->call_counts();
  // Positions 5..27: pages at 8, 12, ..., 24 are new (5 boundaries); 4 holds 5..7 already.
  EXPECT_EQ(after.reserve - before.reserve, 5);
  EXPECT_EQ(after.commit - before.commit, steps);
  EXPECT_EQ(after.describe, before.describe);
  EXPECT_EQ(local->num_tokens(), 28);
  ExpectSameKv(*local, *served);
  auto st = local->stats();
  ASSERT_THAT(st, IsOk());
  EXPECT_EQ(st->seq_len, 28);
  EXPECT_GT(st->pages_evicted, 0u);  // the sliding layer's old pages left
}

TEST_F(LocalPathTest, CommitDropsEvictedPagesFromTheTable) {
  auto h = Allocate({0, 4});
  auto twin = Allocate({0, 4});
  std::vector<KvHistory> history(2, KvHistory(kKvHeads, kHeadDim));
  for (int i = 0; i < 14; ++i) Step(*h, *twin, history, 1);
  auto d = h->describe();  // the arena's table
  ASSERT_THAT(d, IsOk());
  EXPECT_GT(d->layers[1].first_pos, 0);
  auto kv = h->kv_cache(1);
  ASSERT_THAT(kv, IsOk());
  EXPECT_EQ(kv->first_pos, d->layers[1].first_pos);
  // The local table agreed before that Describe: the next steps need no Describe.
  const CallCounts before = client_->call_counts();
  for (int i = 0; i < 6; ++i) Step(*h, *twin, history, 1);
  EXPECT_EQ(client_->call_counts().describe, before.describe);
  ExpectSameKv(*h, *twin);
}

TEST_F(LocalPathTest, PopnAndResetReReadTheTable) {
  auto h = Allocate({0, 0});
  auto twin = Allocate({0, 0});
  std::vector<KvHistory> history(2, KvHistory(kKvHeads, kHeadDim));
  for (int i = 0; i < 10; ++i) Step(*h, *twin, history, 1);
  ASSERT_EQ(h->popn(3)->popped, 3);
  ASSERT_EQ(twin->popn(3)->popped, 3);
  for (KvHistory& k : history) k.Truncate(7);
  EXPECT_EQ(h->num_tokens(), 7);
  for (int i = 0; i < 4; ++i) Step(*h, *twin, history, 1);
  ExpectSameKv(*h, *twin);
  ASSERT_THAT(h->reset(), IsOk());
  ASSERT_THAT(twin->reset(), IsOk());
  std::vector<KvHistory> fresh(2, KvHistory(kKvHeads, kHeadDim));
  Step(*h, *twin, fresh, 3);
  ExpectSameKv(*h, *twin);
  EXPECT_EQ(h->stats()->seq_len, 3);
}

TEST_F(LocalPathTest, BatchReserveIsOneCallPerPageBoundary) {
  std::vector<std::shared_ptr<GenericKvCacheHandle>> caches;
  for (int i = 0; i < 4; ++i) caches.push_back(Allocate({0, 0}));
  CacheTokenList one;
  for (auto& c : caches) one.emplace_back(c, 1);
  const CallCounts before = client_->call_counts();
  for (int step = 0; step < 12; ++step) {
    ASSERT_THAT(client_->Reserve(one), IsOk());
    for (auto& c : caches) {
      for (int layer = 0; layer < 2; ++layer) {
        HostTensor k = Random(kKvHeads, 1), v = Random(kKvHeads, 1);
        ASSERT_THAT(c->append_local(layer, k.arg(), v.arg()), IsOk());
      }
    }
    ASSERT_THAT(client_->Commit(one), IsOk());
  }
  const CallCounts after = client_->call_counts();
  EXPECT_EQ(after.reserve - before.reserve, 12 / kPageSize);
  EXPECT_EQ(after.commit - before.commit, 12);
  for (auto& c : caches) EXPECT_EQ(c->stats()->seq_len, 12);
}

TEST_F(LocalPathTest, WritesNeedReservedPagesAndWholeSteps) {
  auto h = Allocate({0, 0});
  HostTensor q = Random(kQHeads, 1), k = Random(kKvHeads, 1), v = Random(kKvHeads, 1);
  EXPECT_THAT(h->attention_local(0, q.arg(), k.arg(), v.arg()),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(h->reserve(1), IsOk());
  EXPECT_EQ(h->reserved_until(), kPageSize);
  HostTensor bad = Random(kKvHeads + 1, 1);
  EXPECT_THAT(h->append_local(0, bad.arg(), bad.arg()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(h->attention_local(5, q.arg(), k.arg(), v.arg()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(h->attention_local(0, q.arg(), k.arg(), v.arg()), IsOk());
  // Layer 1 was not written: committing would publish garbage.
  EXPECT_THAT(h->commit(1), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(h->append_local(1, k.arg(), v.arg()), IsOk());
  ASSERT_THAT(h->commit(1), IsOk());
  EXPECT_EQ(h->num_tokens(), 1);
  auto narrow = h->with_sequence_length(1);
  ASSERT_THAT(narrow, IsOk());
  EXPECT_THAT((*narrow)->reserve(1), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(LocalPathTest, GetKvLocalReadsServedWritesThroughTheMapping) {
  auto h = Allocate({0, 6});
  std::vector<KvHistory> history(2, KvHistory(kKvHeads, kHeadDim));
  for (int i = 0; i < 3; ++i) {
    for (int layer = 0; layer < 2; ++layer) {
      HostTensor k = Random(kKvHeads, 5), v = Random(kKvHeads, 5);
      ASSERT_THAT(h->append(layer, k.arg(), v.arg()), IsOk());
      history[layer].Append(k, v);
    }
  }
  for (int layer = 0; layer < 2; ++layer) {
    SCOPED_TRACE(layer);
    auto mapped = h->get_kv_local(layer);
    ASSERT_THAT(mapped, IsOk());
    EXPECT_EQ(mapped->first_pos, h->get_kv(layer)->first_pos);
    if (layer == 1) {
      EXPECT_GT(mapped->first_pos, 0);  // the sliding layer kept its tail
    }
    EXPECT_EQ(mapped->k.shape,
              (std::vector<int64_t>{1, kKvHeads, 15 - mapped->first_pos, kHeadDim}));
    EXPECT_THAT(
        testing::CompareExact("k", mapped->k, history[layer].HeadMajor(0, mapped->first_pos)),
        IsOk());
    EXPECT_THAT(
        testing::CompareExact("v", mapped->v, history[layer].HeadMajor(1, mapped->first_pos)),
        IsOk());
  }
  auto narrow = h->with_sequence_length(7);
  ASSERT_THAT(narrow, IsOk());
  auto seven = (*narrow)->get_kv_local(0);
  ASSERT_THAT(seven, IsOk());
  EXPECT_EQ(seven->k.shape[2], 7);
  EXPECT_THAT(h->get_kv_local(2), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(LocalPathTest, ReserveRespectsMaxTokens) {
  auto h = Allocate({0}, /*max_tokens=*/6);
  h->set_reserve_ahead(100);
  ASSERT_THAT(h->reserve(2), IsOk());
  EXPECT_EQ(h->reserved_until(), 8);  // 6 tokens need 2 pages of 4
  EXPECT_THAT(h->reserve(7), StatusIs(absl::StatusCode::kResourceExhausted));
}

}  // namespace
}  // namespace kvarena
