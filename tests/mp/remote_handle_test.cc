// The handle API through a real kvarenad: the same values as inproc (geometry, device,
// block tables, stats, clones), pool views through the mapped pool that read exactly what
// get_kv returns, zero-copy tensors equal to inline ones, and DecodeBatch over the mapping.
#include <cstring>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/mp/mp_fixture.h"
#include "tests/support/batch_reference.h"
#include "tests/support/kv_history.h"
#include "tests/support/status_matchers.h"

namespace kvarena::testing {
namespace {

using ::testing::HasSubstr;

class RemoteHandleTest : public MultiProcessTest {
 protected:
  void SetUp() override {
    MultiProcessTest::SetUp();
    StartDaemon();
    auto c = Client::Connect(address());
    ASSERT_THAT(c, IsOk());
    client_ = *c;
  }
  void TearDown() override {
    client_.reset();
    MultiProcessTest::TearDown();
  }
  std::shared_ptr<GenericKvCacheHandle> Allocate() {
    CacheSpec spec;
    spec.num_layers = 2;
    spec.num_kv_heads = 2;
    spec.head_dim = 32;
    spec.dtype = DType::kFloat16;
    spec.page_size = 4;
    spec.layer_windows = {0, 6};
    auto h = client_->Allocate(spec);
    EXPECT_THAT(h, IsOk());
    return h.ok() ? *h : nullptr;
  }
  // n tokens on every layer; returns the K sent to layer 0.
  void Append(GenericKvCacheHandle& h, int64_t n) {
    for (int layer = 0; layer < h.num_layers(); ++layer) {
      HostTensor k = RandomTensor(rng_, h.dtype(), 2, n, 32);
      HostTensor v = RandomTensor(rng_, h.dtype(), 2, n, 32);
      ASSERT_THAT(h.append(layer, k.arg(), v.arg()), IsOk());
    }
  }
  std::shared_ptr<Client> client_;
  std::mt19937_64 rng_{seed_};
};

TEST_F(RemoteHandleTest, ReportsGeometryDeviceAndPages) {
  auto h = Allocate();
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->num_layers(), 2);
  EXPECT_EQ(h->num_heads(), 2);
  EXPECT_EQ(h->head_dim(), 32);
  EXPECT_EQ(h->dtype(), DType::kFloat16);
  EXPECT_EQ(h->page_size(), 4);
  EXPECT_EQ(h->device(), "cpu");
  Append(*h, 10);
  EXPECT_EQ(h->num_tokens(), 10);
  auto t0 = h->block_table(0);
  ASSERT_THAT(t0, IsOk());
  EXPECT_EQ(t0->size(), 3u);
  EXPECT_EQ(std::set<int32_t>(t0->begin(), t0->end()).size(), 3u);
  auto st = h->stats();
  ASSERT_THAT(st, IsOk());
  EXPECT_EQ(st->seq_len, 10);
  EXPECT_EQ(st->layers_sliding, 1);
  EXPECT_GT(st->pages_used, 3);
  EXPECT_THAT(h->pages_used(), IsOkAndHolds(st->pages_used));
}

TEST_F(RemoteHandleTest, PoolViewsReadExactlyWhatGetKvReturns) {
  auto h = Allocate();
  Append(*h, 13);  // layer 1 (window 6) has evicted its first pages
  for (int layer = 0; layer < 2; ++layer) {
    SCOPED_TRACE(layer);
    auto kv = h->get_kv(layer);
    auto keys = h->key_cache(layer);
    auto values = h->value_cache(layer);
    ASSERT_THAT(kv, IsOk());
    ASSERT_THAT(keys, IsOk());
    ASSERT_THAT(values, IsOk());
    EXPECT_EQ(keys->first_pos, kv->first_pos);
    EXPECT_EQ(keys->len, 13);
    auto table = h->block_table(layer);
    ASSERT_THAT(table, IsOk());
    EXPECT_EQ(keys->page_ids, *table);
    // Token-major pages vs head-major get_kv: [heads][tokens][head_dim].
    const int64_t n = keys->len - keys->first_pos;
    const size_t row = size_t(h->head_dim()) * 2;
    for (int64_t t = 0; t < n; ++t) {
      for (int head = 0; head < h->num_kv_heads(); ++head) {
        const size_t at = (size_t(head) * n + t) * row;
        EXPECT_EQ(std::memcmp(keys->TokenPtr(kv->first_pos + t) + head * row,
                              kv->k.data.data() + at, row),
                  0)
            << t;
        EXPECT_EQ(std::memcmp(values->TokenPtr(kv->first_pos + t) + head * row,
                              kv->v.data.data() + at, row),
                  0)
            << t;
      }
    }
  }
}

TEST_F(RemoteHandleTest, ZeroCopyAttentionEqualsInlineBitForBit) {
  ClientOptions inline_options;
  inline_options.inline_tensors = true;
  auto inline_client = Client::Connect(address(), inline_options);
  ASSERT_THAT(inline_client, IsOk());
  CacheSpec spec;
  spec.num_layers = 1;
  spec.num_kv_heads = 2;
  spec.head_dim = 32;
  spec.dtype = DType::kBFloat16;
  auto zc = client_->Allocate(spec);
  auto in = (*inline_client)->Allocate(spec);
  ASSERT_THAT(zc, IsOk());
  ASSERT_THAT(in, IsOk());
  for (int n : {7, 1, 1, 3}) {
    HostTensor q = RandomTensor(rng_, spec.dtype, 8, n, 32);
    HostTensor k = RandomTensor(rng_, spec.dtype, 2, n, 32);
    HostTensor v = RandomTensor(rng_, spec.dtype, 2, n, 32);
    auto a = (*zc)->attention(0, q.arg(), k.arg(), v.arg());
    auto b = (*in)->attention(0, q.arg(), k.arg(), v.arg());
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ(a->shape, b->shape);
    EXPECT_EQ(a->data, b->data);
  }
  EXPECT_EQ((*zc)->get_kv(0)->k.data, (*in)->get_kv(0)->k.data);
}

// A DecodeBatch over the daemon's pool as this process maps it: every sequence matches
// the reference, what it wrote is what the daemon's get_kv returns, the steps cost one
// Commit RPC each and a Reserve only at page boundaries, and releasing frees every page.
TEST_F(RemoteHandleTest, DecodeBatchThroughTheMappedPool) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  const int64_t before = WaitForArenaPages([](int64_t) { return true; });
  std::vector<std::shared_ptr<GenericKvCacheHandle>> caches;
  std::vector<std::vector<KvHistory>> history;
  for (int64_t len : {0, 5, 11, 16}) {
    caches.push_back(Allocate());  // 2 layers, the second sliding (window 6), page 4
    ASSERT_NE(caches.back(), nullptr);
    history.emplace_back(2, KvHistory(2, 32));
    ASSERT_THAT(PrefillLocal(*caches.back(), history.back(), len, rng_), IsOk());
  }
  auto batch = DecodeBatch::Create(caches);
  ASSERT_THAT(batch, IsOk());
  const CallCounts calls = client_->call_counts();
  constexpr int kSteps = 24;
  for (int step = 0; step < kSteps; ++step) {
    ASSERT_THAT(CheckedBatchStep(**batch, caches, history, rng_, 8), IsOk()) << "step " << step;
  }
  const CallCounts after = client_->call_counts();
  EXPECT_EQ(after.commit - calls.commit, kSteps);
  EXPECT_LE(after.reserve - calls.reserve, kSteps / 4 + 1);  // page 4: a boundary per 4 steps
  EXPECT_EQ(after.describe - calls.describe, 0);
  EXPECT_THAT(CheckBatchKv(caches, history), IsOk());
  for (const auto& h : caches) ASSERT_THAT(h->release(), IsOk());
  EXPECT_EQ(WaitForArenaPages([&](int64_t p) { return p == before; }), before);
}

TEST_F(RemoteHandleTest, ClonesShareTheCacheAndReleaseEndsThemAll) {
  auto h = Allocate();
  Append(*h, 6);
  auto clone = h->clone_handle();
  auto narrow = h->with_sequence_length(4);
  ASSERT_THAT(narrow, IsOk());
  EXPECT_EQ((*narrow)->num_tokens(), 4);
  EXPECT_THAT(h->with_sequence_length(7), StatusIs(absl::StatusCode::kInvalidArgument));
  auto r = clone->popn(2);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->popped, 2);
  EXPECT_EQ(h->num_tokens(), 4);
  ASSERT_THAT(h->release(), IsOk());
  EXPECT_FALSE(clone->is_valid());
  EXPECT_FALSE((*narrow)->is_valid());
  EXPECT_THAT(clone->stats(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(client_->CacheStats(h->cache_id()), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(RemoteHandleTest, ErrorsCarryTheDaemonsCodes) {
  auto h = Allocate();
  HostTensor k = RandomTensor(rng_, DType::kFloat16, 2, 1, 32);
  HostTensor wrong = RandomTensor(rng_, DType::kFloat16, 3, 1, 32);
  EXPECT_THAT(h->append(0, 5, k.arg(), k.arg()), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(h->append(0, wrong.arg(), wrong.arg()), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client_->OpenCache("no-such-cache"), StatusIs(absl::StatusCode::kNotFound));
  CacheSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = 2;
  spec.head_dim = 32;
  spec.dtype = DType::kFloat16;
  auto dup = client_->Allocate(spec, h->cache_id());
  EXPECT_THAT(dup, StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(client_->Ping(), IsOk());
  EXPECT_THAT(client_->Health(), IsOkAndHolds(ServingStatus::kServing));
}

}  // namespace
}  // namespace kvarena::testing
