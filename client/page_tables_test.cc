// The batch page tables (kvarena/page_tables.h) against "inproc:": a decode batch of caches
// of different lengths (a partial last page, exact page multiples, a sliding layer that
// evicted pages) is read back through the exported FlashInfer and vLLM arrays alone —
// gathering K/V from the mapped pool bytes by the exported page ids — and attended by the
// float64 reference, which must match attention_local's output; vLLM's slot_mapping is
// written through and read back with get_kv.
#include "kvarena/page_tables.h"

#include <cstring>
#include <functional>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvarena/client.h"
#include "tests/support/batch_reference.h"
#include "tests/support/inproc_fixture.h"
#include "tests/support/kv_history.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_seed.h"

namespace kvarena {
namespace {

using testing::HostTensor;
using testing::IsOk;
using testing::KvHistory;

constexpr int kKvHeads = 2;
constexpr int kQHeads = 4;
constexpr int kHeadDim = 16;
constexpr int kPageSize = 4;
constexpr int kWindow = 6;
const std::vector<int> kWindows = {0, kWindow};  // a global layer and a sliding one

class PageTablesTest : public testing::InprocClientFixture<::testing::TestWithParam<DType>> {
 protected:
  void SetUp() override {
    rng_.seed(testing::TestSeed());
    InprocClientFixture::SetUp();
  }

  // Caches of the given lengths, each prefilled through the local path in one block.
  void Prefill(const std::vector<int64_t>& lens) {
    CacheSpec spec =
        testing::MakeSpec(int(kWindows.size()), kKvHeads, kHeadDim, GetParam(), kPageSize);
    spec.layer_windows = kWindows;
    for (int64_t n : lens) {
      auto h = NewCache(spec);
      ASSERT_NE(h, nullptr);
      caches_.push_back(h);
      history_.emplace_back(kWindows.size(), KvHistory(kKvHeads, kHeadDim));
      ASSERT_THAT(testing::PrefillLocal(*h, history_.back(), n, rng_), IsOk());
    }
    auto pool = caches_.front()->pool_view();
    ASSERT_THAT(pool, IsOk());
    pool_ = *pool;
  }

  HostTensor Random(int heads, int64_t n) {
    return testing::RandomTensor(rng_, GetParam(), heads, n, kHeadDim);
  }
  CacheTokenList Batch(const std::vector<int64_t>& tokens) const {
    CacheTokenList batch;
    for (size_t b = 0; b < caches_.size(); ++b) batch.emplace_back(caches_[b], tokens[b]);
    return batch;
  }
  CacheTokenList Batch(int64_t tokens) const {
    return Batch(std::vector<int64_t>(caches_.size(), tokens));
  }

  // The K and V of n keys read from the pool bytes, key j at the page page_of(j) names:
  // [1, kv_heads, n, head_dim] each, as the reference takes them.
  std::pair<HostTensor, HostTensor> Gather(const std::function<int32_t(int64_t)>& page_of,
                                           int64_t n) const {
    std::pair<HostTensor, HostTensor> kv;
    for (int part = 0; part < 2; ++part) {
      HostTensor& t = part == 0 ? kv.first : kv.second;
      t.dtype = GetParam();
      t.shape = {1, kKvHeads, n, kHeadDim};
      t.values.resize(size_t(kKvHeads) * n * kHeadDim);
      for (int64_t j = 0; j < n; ++j) {
        const uint8_t* token = pool_.SlotPtr(part, int64_t(page_of(j)) * kPageSize + j % kPageSize);
        const std::string bytes(reinterpret_cast<const char*>(token), pool_.layout.TokenBytes());
        const std::vector<double> row = testing::DecodeValues(bytes, GetParam());
        for (int h = 0; h < kKvHeads; ++h) {
          std::copy_n(row.begin() + h * kHeadDim, kHeadDim,
                      t.values.begin() + (size_t(h) * n + j) * kHeadDim);
        }
      }
      t.bytes = testing::EncodeValues(t.values, GetParam());
    }
    return kv;
  }

  // Sequence b's keys as the arrays name them — first_pos, n keys, key j on page_of(j) —
  // must be exactly what was written there, and attending q (the last position) over
  // them in float64 must give `out`.
  void CheckThroughTable(const char* what, size_t b, int layer, int64_t first_pos, int64_t n,
                         const std::function<int32_t(int64_t)>& page_of, const HostTensor& q,
                         const TensorOut& out) const {
    SCOPED_TRACE(::testing::Message() << what << " sequence " << b << " layer " << layer);
    const KvHistory& truth = history_[b][layer];
    ASSERT_EQ(first_pos + n, truth.len());
    auto [k, v] = Gather(page_of, n);
    EXPECT_EQ(k.values, truth.HeadMajor(0, first_pos));
    EXPECT_EQ(v.values, truth.HeadMajor(1, first_pos));
    KvHistory gathered(kKvHeads, kHeadDim);
    gathered.Append(k, v);
    // Relative positions: the last key is the query's own, the window masks the rest.
    EXPECT_THAT(testing::CompareOutput(what, out, gathered.Attention(q, n - 1, 0, kWindows[layer])),
                IsOk());
  }

  // One decode step of every cache through attention_local, checked through both exports.
  void DecodeStep() {
    ASSERT_THAT(client_->Reserve(Batch(1)), IsOk());
    for (int layer = 0; layer < int(kWindows.size()); ++layer) {
      // Built before the writes with the new token counted, and after with it written.
      auto ahead = BuildFlashInferPageTable(Batch(1), layer);
      ASSERT_THAT(ahead, IsOk());
      std::vector<HostTensor> qs;
      std::vector<TensorOut> outs;
      for (size_t b = 0; b < caches_.size(); ++b) {
        HostTensor q = Random(kQHeads, 1), k = Random(kKvHeads, 1), v = Random(kKvHeads, 1);
        auto out = caches_[b]->attention_local(layer, q.arg(), k.arg(), v.arg());
        ASSERT_THAT(out, IsOk());
        history_[b][layer].Append(k, v);
        qs.push_back(std::move(q));
        outs.push_back(*std::move(out));
      }
      auto fi = BuildFlashInferPageTable(Batch(0), layer);
      ASSERT_THAT(fi, IsOk());
      EXPECT_EQ(fi->indptr, ahead->indptr);
      EXPECT_EQ(fi->indices, ahead->indices);
      EXPECT_EQ(fi->last_page_len, ahead->last_page_len);
      auto vllm = BuildVllmBlockTables(Batch(0), layer);
      ASSERT_THAT(vllm, IsOk());
      EXPECT_TRUE(vllm->slot_mapping.empty());
      ASSERT_EQ(fi->indptr.size(), caches_.size() + 1);
      for (size_t b = 0; b < caches_.size(); ++b) {
        const int32_t pages = fi->indptr[b + 1] - fi->indptr[b];
        ASSERT_GT(pages, 0);
        const int32_t last = fi->last_page_len[b];
        ASSERT_GE(last, 1);
        ASSERT_LE(last, kPageSize);
        const int64_t kv_len = int64_t(pages - 1) * kPageSize + last;
        const int32_t* ids = fi->indices.data() + fi->indptr[b];
        CheckThroughTable(
            "flashinfer", b, layer, fi->first_pos[b], kv_len,
            [ids](int64_t j) { return ids[j / kPageSize]; }, qs[b], outs[b]);

        const int32_t* row = vllm->block_tables.data() + b * vllm->max_blocks;
        const int64_t blocks = (vllm->seq_lens[b] + kPageSize - 1) / kPageSize;
        for (int64_t j = blocks; j < vllm->max_blocks; ++j) EXPECT_EQ(row[j], kPadBlockId);
        EXPECT_EQ(vllm->first_pos[b], fi->first_pos[b]);
        CheckThroughTable(
            "vllm", b, layer, vllm->first_pos[b], vllm->seq_lens[b],
            [row](int64_t j) { return row[j / kPageSize]; }, qs[b], outs[b]);
      }
    }
    ASSERT_THAT(client_->Commit(Batch(1)), IsOk());
  }

  std::mt19937_64 rng_;
  std::vector<std::shared_ptr<GenericKvCacheHandle>> caches_;
  std::vector<std::vector<KvHistory>> history_;  // [cache][layer]
  KvPoolView pool_;
};

TEST_P(PageTablesTest, DecodeThroughExportedArraysMatchesTheReference) {
  // With 5 steps: lengths 4..8, 8..12, 13..17, 22..26 — partial last pages, exact page
  // multiples (4, 8, 12, 16, 24) — and the sliding layer evicts pages of the longer ones.
  Prefill({3, 7, 12, 21});
  const CallCounts before = client_->call_counts();
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE(step);
    DecodeStep();
  }
  EXPECT_EQ(client_->call_counts().describe, before.describe);  // the tables cost no RPC
  auto t = caches_.back()->local_table(1);
  ASSERT_THAT(t, IsOk());
  EXPECT_GT(t->first_pos, 0);  // the sliding layer's table starts past evicted pages
  EXPECT_EQ(t->len, 26);
}

TEST_P(PageTablesTest, SlotMappingAddressesTheNewTokens) {
  Prefill({2, 4, 9});
  const std::vector<int64_t> n = {3, 1, 6};  // crosses a page boundary, fills one, spans two
  ASSERT_THAT(client_->Reserve(Batch(n)), IsOk());
  for (int layer = 0; layer < int(kWindows.size()); ++layer) {
    auto vllm = BuildVllmBlockTables(Batch(n), layer);
    ASSERT_THAT(vllm, IsOk());
    ASSERT_EQ(vllm->query_start_loc, (std::vector<int32_t>{0, 3, 4, 10}));
    ASSERT_EQ(vllm->slot_mapping.size(), 10u);
    for (size_t b = 0; b < caches_.size(); ++b) {
      // The caller's own "kernel": k/v of the new tokens copied to their slots.
      HostTensor k = Random(kKvHeads, n[b]), v = Random(kKvHeads, n[b]);
      for (int64_t i = 0; i < n[b]; ++i) {
        const int64_t slot = vllm->slot_mapping[vllm->query_start_loc[b] + i];
        for (int part = 0; part < 2; ++part) {
          const std::string& src = (part == 0 ? k : v).bytes;
          for (int h = 0; h < kKvHeads; ++h) {
            const size_t head_bytes = kHeadDim * pool_.layout.ElemBytes();
            std::memcpy(pool_.SlotPtr(part, slot) + h * head_bytes,
                        src.data() + (size_t(h) * n[b] + i) * head_bytes, head_bytes);
          }
        }
      }
      history_[b][layer].Append(k, v);
    }
  }
  ASSERT_THAT(client_->Commit(Batch(n)), IsOk());
  for (size_t b = 0; b < caches_.size(); ++b) {
    for (int layer = 0; layer < int(kWindows.size()); ++layer) {
      SCOPED_TRACE(::testing::Message() << "sequence " << b << " layer " << layer);
      auto kv = caches_[b]->get_kv(layer);  // through the arena, not the mapping
      ASSERT_THAT(kv, IsOk());
      const KvHistory& truth = history_[b][layer];
      EXPECT_EQ(kv->first_pos + kv->k.shape[2], truth.len());
      EXPECT_THAT(testing::CompareExact("k", kv->k, truth.HeadMajor(0, kv->first_pos)), IsOk());
      EXPECT_THAT(testing::CompareExact("v", kv->v, truth.HeadMajor(1, kv->first_pos)), IsOk());
    }
  }
  DecodeStep();  // and the next step attends over them through the tables
}

INSTANTIATE_TEST_SUITE_P(DTypes, PageTablesTest,
                         ::testing::Values(DType::kFloat16, DType::kBFloat16, DType::kFloat32),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace kvarena
