// The handle API against "inproc:" — the same core code as the daemon, in this process,
// so views into the pool are real pointers.
#include <cstring>
#include <random>
#include <set>

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

class InprocClientTest : public testing::InprocClientFixture<> {
 protected:
  InprocClientTest() : InprocClientFixture(testing::InprocOptions(/*num_threads=*/0)) {}

  std::shared_ptr<GenericKvCacheHandle> Allocate(std::vector<int> windows = {},
                                                 DType dtype = DType::kFloat32,
                                                 int64_t max_tokens = 0) {
    CacheSpec spec = testing::MakeSpec(2, kKvHeads, kHeadDim, dtype, kPageSize);
    spec.layer_windows = std::move(windows);
    spec.max_tokens = max_tokens;
    auto h = NewCache(spec);
    if (h != nullptr) {
      for (int l = 0; l < h->num_layers(); ++l) history_.emplace_back(kKvHeads, kHeadDim);
    }
    return h;
  }

  HostTensor Random(int heads, int64_t n, DType dtype = DType::kFloat32) {
    return testing::RandomTensor(rng_, dtype, heads, n, kHeadDim);
  }

  // append + attend n tokens on every layer; checks against the reference.
  void Step(GenericKvCacheHandle& h, int64_t n) {
    for (int layer = 0; layer < h.num_layers(); ++layer) {
      SCOPED_TRACE(layer);
      const int64_t pos = history_[layer].len();
      HostTensor q = Random(kQHeads, n, h.dtype()), k = Random(kKvHeads, n, h.dtype()),
                 v = Random(kKvHeads, n, h.dtype());
      auto out = h.attention(layer, q.arg(), k.arg(), v.arg());
      ASSERT_THAT(out, IsOk());
      history_[layer].Append(k, v);
      EXPECT_THAT(
          testing::CompareOutput("attention", *out,
                                 history_[layer].Attention(q, pos, 0, h.layer_windows()[layer])),
          IsOk());
    }
  }

  std::mt19937_64 rng_{42};
  std::vector<KvHistory> history_;
};

TEST_F(InprocClientTest, HandleReportsGeometry) {
  auto h = Allocate({0, 8});
  ASSERT_NE(h, nullptr);
  EXPECT_FALSE(h->cache_id().empty());
  EXPECT_EQ(h->num_layers(), 2);
  EXPECT_EQ(h->num_heads(), kKvHeads);
  EXPECT_EQ(h->head_dim(), kHeadDim);
  EXPECT_EQ(h->dtype(), DType::kFloat32);
  EXPECT_EQ(h->page_size(), kPageSize);
  EXPECT_EQ(h->device(), "cpu");
  EXPECT_EQ(h->num_tokens(), 0);
  EXPECT_TRUE(h->is_valid());
  EXPECT_TRUE(client_->is_inproc());
  EXPECT_FALSE(client_->session_id().empty());
  EXPECT_THAT(client_->Health(), IsOk());
  EXPECT_THAT(client_->Ping(), IsOk());
}

TEST_F(InprocClientTest, PrefillAndDecodeMatchReference) {
  auto h = Allocate();
  Step(*h, 10);
  for (int i = 0; i < 5; ++i) Step(*h, 1);
  EXPECT_EQ(h->num_tokens(), 15);
  auto st = h->stats();
  ASSERT_THAT(st, IsOk());
  EXPECT_EQ(st->seq_len, 15);
  EXPECT_EQ(st->pages_used, 2 * 4);  // ceil(15 / 4) pages on each of 2 layers
  EXPECT_THAT(h->pages_used(), testing::IsOkAndHolds(8));
  EXPECT_EQ(st->layers_materialized, 2);
}

TEST_F(InprocClientTest, AppendAtWrongPositionIsInvalidAndChangesNothing) {
  auto h = Allocate();
  HostTensor k = Random(kKvHeads, 3), v = Random(kKvHeads, 3);
  ASSERT_THAT(h->append(0, k.arg(), v.arg()), IsOk());
  EXPECT_EQ(h->layer_len(0), 3);
  EXPECT_THAT(h->append(0, 7, k.arg(), v.arg()), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(h->append(5, k.arg(), v.arg()), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(h->layer_len(0), 3);
}

TEST_F(InprocClientTest, PopnRollsBackAndReappendedTokensMatch) {
  auto h = Allocate();
  Step(*h, 9);
  auto r = h->popn(3);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->popped, 3);
  EXPECT_EQ(h->num_tokens(), 6);
  EXPECT_EQ(h->layer_len(1), 6);
  for (KvHistory& hist : history_) hist.Truncate(6);
  auto kv = h->get_kv(0);
  ASSERT_THAT(kv, IsOk());
  EXPECT_THAT(testing::CompareExact("k", kv->k, history_[0].HeadMajor(0, 0)), IsOk());
  Step(*h, 1);
  Step(*h, 2);
  EXPECT_EQ(h->num_tokens(), 9);
  EXPECT_THAT(h->pages_used(), testing::IsOkAndHolds(2 * 3));
}

TEST_F(InprocClientTest, PopnBeyondSeqLenRefusesAndChangesNothing) {
  auto h = Allocate();
  Step(*h, 5);
  auto r = h->popn(6);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->popped, 0);
  EXPECT_FALSE(r->refusal.empty());
  EXPECT_EQ(h->num_tokens(), 5);
  EXPECT_THAT(h->popn(0), IsOk());
}

TEST_F(InprocClientTest, GetKvReturnsWhatWasSent) {
  auto h = Allocate({}, DType::kFloat16);
  Step(*h, 7);
  for (int layer = 0; layer < 2; ++layer) {
    auto kv = h->get_kv(layer);
    ASSERT_THAT(kv, IsOk());
    EXPECT_EQ(kv->first_pos, 0);
    EXPECT_EQ(kv->k.shape, (std::vector<int64_t>{1, kKvHeads, 7, kHeadDim}));
    EXPECT_THAT(testing::CompareExact("k", kv->k, history_[layer].HeadMajor(0, 0)), IsOk());
    EXPECT_THAT(testing::CompareExact("v", kv->v, history_[layer].HeadMajor(1, 0)), IsOk());
  }
}

// Every token of key_cache / value_cache reads back the bytes get_kv returns.
TEST_F(InprocClientTest, KeyAndValueViewsReadWhatGetKvReturns) {
  auto h = Allocate({0, 6});
  Step(*h, 11);
  Step(*h, 1);
  for (int layer = 0; layer < 2; ++layer) {
    SCOPED_TRACE(layer);
    auto kv = h->get_kv(layer);
    auto key = h->key_cache(layer);
    auto value = h->value_cache(layer);
    ASSERT_THAT(kv, IsOk());
    ASSERT_THAT(key, IsOk());
    ASSERT_THAT(value, IsOk());
    EXPECT_EQ(key->len, 12);
    EXPECT_LE(key->first_pos, kv->first_pos);
    const size_t row = kHeadDim * sizeof(float);
    const int64_t n = 12 - kv->first_pos;
    for (int64_t t = kv->first_pos; t < 12; ++t) {
      for (int head = 0; head < kKvHeads; ++head) {
        const size_t at = (size_t(head) * n + (t - kv->first_pos)) * row;
        EXPECT_EQ(std::memcmp(key->TokenPtr(t) + head * row, kv->k.data.data() + at, row), 0)
            << "k t=" << t << " head=" << head;
        EXPECT_EQ(std::memcmp(value->TokenPtr(t) + head * row, kv->v.data.data() + at, row), 0)
            << "v t=" << t << " head=" << head;
      }
    }
    auto both = h->kv_cache(layer);
    ASSERT_THAT(both, IsOk());
    EXPECT_EQ(both->TokenPtr(1, 11), value->TokenPtr(11));
    EXPECT_EQ(both->view().TokenPtr(0, 11), key->TokenPtr(11));
  }
  // The sliding layer (window 6) evicted its oldest pages; the global one did not.
  auto kv1 = h->get_kv(1);
  ASSERT_THAT(kv1, IsOk());
  EXPECT_GT(kv1->first_pos, 0);
}

TEST_F(InprocClientTest, BlockTableListsDistinctPages) {
  auto h = Allocate();
  Step(*h, 10);
  auto t0 = h->block_table(0), t1 = h->block_table(1);
  ASSERT_THAT(t0, IsOk());
  ASSERT_THAT(t1, IsOk());
  EXPECT_EQ(t0->size(), 3u);
  std::set<int32_t> ids(t0->begin(), t0->end());
  ids.insert(t1->begin(), t1->end());
  EXPECT_EQ(ids.size(), 6u);
  EXPECT_THAT(h->block_table(2), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(InprocClientTest, WithSequenceLengthNarrowsCountAndViews) {
  auto h = Allocate();
  Step(*h, 10);
  auto narrow = h->with_sequence_length(5);
  ASSERT_THAT(narrow, IsOk());
  EXPECT_EQ((*narrow)->num_tokens(), 5);
  EXPECT_EQ((*narrow)->cache_id(), h->cache_id());
  auto key = (*narrow)->key_cache(0);
  ASSERT_THAT(key, IsOk());
  EXPECT_EQ(key->len, 5);
  EXPECT_EQ(key->page_ids.size(), 2u);
  EXPECT_EQ(h->num_tokens(), 10);
  EXPECT_THAT(h->with_sequence_length(11), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(InprocClientTest, CloneSharesTheCacheAndReleaseInvalidatesBoth) {
  auto h = Allocate();
  Step(*h, 4);
  auto clone = h->clone_handle();
  EXPECT_NE(clone.get(), h.get());
  EXPECT_EQ(clone->cache_id(), h->cache_id());
  EXPECT_EQ(clone->num_tokens(), 4);
  Step(*clone, 1);  // through the clone: the original sees it
  EXPECT_EQ(h->num_tokens(), 5);
  ASSERT_THAT(clone->release(), IsOk());
  EXPECT_FALSE(clone->is_valid());
  EXPECT_FALSE(h->is_valid());
  HostTensor k = Random(kKvHeads, 1), v = Random(kKvHeads, 1);
  EXPECT_THAT(h->append(0, k.arg(), v.arg()), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(client_->CacheStats(h->cache_id()), StatusIs(absl::StatusCode::kNotFound));
  auto st = client_->Stats();
  ASSERT_THAT(st, IsOk());
  EXPECT_EQ(st->pages.pages_used, 0);
}

TEST_F(InprocClientTest, CacheGoneElsewhereMakesHandleInvalid) {
  auto h = Allocate();
  Step(*h, 2);
  ASSERT_THAT(client_->Release(h->cache_id()), IsOk());
  EXPECT_TRUE(h->is_valid());  // nothing told it yet: validity is checked lazily
  EXPECT_THAT(h->stats(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(h->is_valid());
}

TEST_F(InprocClientTest, ResetDropsTokens) {
  auto h = Allocate();
  Step(*h, 6);
  ASSERT_THAT(h->reset(/*keep_pages=*/true), IsOk());
  EXPECT_EQ(h->num_tokens(), 0);
  EXPECT_EQ(h->layer_len(0), 0);
  ASSERT_THAT(h->reset(), IsOk());
  EXPECT_THAT(h->pages_used(), testing::IsOkAndHolds(0));
  history_.assign(2, KvHistory(kKvHeads, kHeadDim));
  Step(*h, 3);
  EXPECT_EQ(h->num_tokens(), 3);
}

TEST_F(InprocClientTest, AttendOverCachedAndCallWindowMatchReference) {
  auto h = Allocate();
  HostTensor k = Random(kKvHeads, 8), v = Random(kKvHeads, 8);
  ASSERT_THAT(h->append(0, k.arg(), v.arg()), IsOk());
  history_[0].Append(k, v);
  HostTensor q = Random(kQHeads, 4);
  auto out = h->attention(0, /*pos=*/4, q.arg());
  ASSERT_THAT(out, IsOk());
  EXPECT_THAT(testing::CompareOutput("cached", *out, history_[0].Attention(q, 4, 0, 0)), IsOk());
  AttentionOptions opts;
  opts.window = 3;
  opts.scale = 0.5;
  auto windowed = h->attention(0, 4, q.arg(), opts);
  ASSERT_THAT(windowed, IsOk());
  EXPECT_THAT(testing::CompareOutput("window", *windowed, history_[0].Attention(q, 4, 0.5, 3)),
              IsOk());
  EXPECT_THAT(h->attention(0, 6, q.arg()), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(InprocClientTest, MaxTokensIsResourceExhausted) {
  auto h = Allocate({}, DType::kFloat32, /*max_tokens=*/8);
  HostTensor k = Random(kKvHeads, 9), v = Random(kKvHeads, 9);
  EXPECT_THAT(h->append(0, k.arg(), v.arg()), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(h->num_tokens(), 0);
}

TEST_F(InprocClientTest, ClientListsCachesAndStats) {
  auto a = Allocate();
  auto b = Allocate({0, 4});
  Step(*a, 5);
  auto caches = client_->ListCaches();
  ASSERT_THAT(caches, IsOk());
  EXPECT_EQ(caches->size(), 2u);
  auto st = client_->Stats();
  ASSERT_THAT(st, IsOk());
  EXPECT_EQ(st->num_caches, 2);
  EXPECT_EQ(st->pages.pages_used, 2 * 2);
  EXPECT_EQ(st->backend, "host");
  auto opened = client_->OpenCache(a->cache_id());
  ASSERT_THAT(opened, IsOk());
  EXPECT_EQ((*opened)->num_tokens(), 5);
  EXPECT_THAT(client_->Allocate(CacheSpec{}), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace kvarena
