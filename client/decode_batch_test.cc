// DecodeBatch against "inproc:": every sequence's output matches the float64 reference and
// its K/V land where get_kv reads them, Plan writes only the page ids that changed, and
// every misuse is refused before anything is written.
#include "kvarena/decode_batch.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <random>

#include "client/client_test_peer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvarena/client.h"
#include "tests/support/batch_reference.h"
#include "tests/support/dtype_codec.h"
#include "tests/support/forwarding_kernels.h"
#include "tests/support/inproc_fixture.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_seed.h"

namespace kvarena {
namespace {

using testing::BatchTensor;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::KvHistory;
using testing::StatusIs;

constexpr int kKvHeads = 2;
constexpr int kQHeads = 8;
constexpr int kHeadDim = 16;
constexpr int kPageSize = 4;

class DecodeBatchTest : public testing::InprocClientFixture<> {
 protected:
  DecodeBatchTest() : InprocClientFixture(testing::InprocOptions(/*num_threads=*/2)) {}

  static CacheSpec Spec(std::vector<int> windows, int head_dim = kHeadDim, int64_t max_tokens = 0) {
    CacheSpec spec =
        testing::MakeSpec(int(windows.size()), kKvHeads, head_dim, DType::kFloat16, kPageSize);
    spec.layer_windows = std::move(windows);
    spec.max_tokens = max_tokens;
    return spec;
  }
  BatchTensor Random(int heads, int batch, int64_t n) {
    return BatchTensor::Random(rng_, DType::kFloat16, batch, heads, n, kHeadDim);
  }
  // A cache of `spec` per length, each prefilled with that many tokens.
  void MakeCaches(const CacheSpec& spec, std::initializer_list<int64_t> lens,
                  std::vector<std::shared_ptr<GenericKvCacheHandle>>& caches,
                  std::vector<std::vector<KvHistory>>& history) {
    for (int64_t len : lens) {
      caches.push_back(NewCache(spec));
      history.emplace_back(size_t(spec.num_layers), KvHistory(kKvHeads, kHeadDim));
      ASSERT_THAT(testing::PrefillLocal(*caches.back(), history.back(), len, rng_), IsOk());
    }
  }
  void Step(DecodeBatch& batch, const std::vector<std::shared_ptr<GenericKvCacheHandle>>& caches,
            std::vector<std::vector<KvHistory>>& history) {
    ASSERT_THAT(testing::CheckedBatchStep(batch, caches, history, rng_, kQHeads), IsOk());
  }
  void ExpectKv(const std::vector<std::shared_ptr<GenericKvCacheHandle>>& caches,
                const std::vector<std::vector<KvHistory>>& history) {
    EXPECT_THAT(testing::CheckBatchKv(caches, history), IsOk());
  }

  const uint64_t seed_ = testing::TestSeed();
  std::mt19937_64 rng_{seed_};
};

// Sequences of different lengths (one empty, one mid-page), global and sliding layers,
// through page boundaries and window evictions.
TEST_F(DecodeBatchTest, EverySequenceMatchesTheReferenceAndStoresItsKv) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (int64_t n : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << "tokens_per_step=" << n);
    const CacheSpec spec = Spec({0, 6, 0});
    std::vector<std::shared_ptr<GenericKvCacheHandle>> caches;
    std::vector<std::vector<KvHistory>> history;
    MakeCaches(spec, {0, 1, 7, 13, 4}, caches, history);
    DecodeBatchOptions options;
    options.tokens_per_step = n;
    auto batch = DecodeBatch::Create(caches, options);
    ASSERT_THAT(batch, IsOk());
    for (int step = 0; step < 10; ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
      Step(**batch, caches, history);
      if (HasFailure()) return;
    }
    ExpectKv(caches, history);
    for (size_t b = 0; b < caches.size(); ++b) {
      EXPECT_EQ(caches[b]->num_tokens(), history[b][0].len());
    }
  }
}

// fp8 caches of one pool with different static scales: each sequence of a batch reads with
// its own cache's scales, as attention_local on a twin cache of the same spec computes it.
TEST_F(DecodeBatchTest, Fp8SequencesAttendWithTheirOwnStaticScales) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  std::vector<std::shared_ptr<GenericKvCacheHandle>> batched, twins;
  for (float s : {0.5f, 2.0f}) {
    CacheSpec spec = Spec({0});
    spec.kv_format = KvFormat::kFp8E4M3;
    spec.k_scales.assign(kKvHeads, s);
    spec.v_scales.assign(kKvHeads, 1 / s);
    spec.v_scales[0] = s;  // the heads differ too
    batched.push_back(NewCache(spec));
    twins.push_back(NewCache(spec));
  }
  auto batch = DecodeBatch::Create(batched);
  ASSERT_THAT(batch, IsOk());
  for (int step = 0; step < 20; ++step) {  // past a page boundary
    SCOPED_TRACE(::testing::Message() << "step " << step);
    ASSERT_THAT((*batch)->Plan(), IsOk());
    const BatchTensor q = Random(kQHeads, 2, 1), k = Random(kKvHeads, 2, 1),
                      v = Random(kKvHeads, 2, 1);
    std::string out(q.bytes.size(), '\xff');
    ASSERT_THAT((*batch)->Run(0, q.arg(), k.arg(), v.arg(), {out.data(), out.size()}), IsOk());
    ASSERT_THAT((*batch)->Commit(), IsOk());
    for (size_t b = 0; b < 2; ++b) {
      ASSERT_THAT(twins[b]->reserve(1), IsOk());
      auto want = twins[b]->attention_local(0, q.rows[b].arg(), k.rows[b].arg(), v.rows[b].arg());
      ASSERT_THAT(want, IsOk());
      ASSERT_THAT(twins[b]->commit(1), IsOk());
      const std::vector<double> got =
          testing::DecodeValues(out.substr(b * out.size() / 2, out.size() / 2), DType::kFloat16);
      const std::vector<double> ref = testing::DecodeValues(want->data, DType::kFloat16);
      ASSERT_EQ(got.size(), ref.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], ref[i], 1e-3 + 1e-3 * std::fabs(ref[i]))
            << "sequence " << b << " " << i;
      }
    }
  }
}

// Plan copies only what changed: nothing within a page, one id per sequence and layer at a
// page boundary, a row whose window moved is rewritten; the rows are the handles' tables.
TEST_F(DecodeBatchTest, PlanWritesOnlyNewPageIds) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  const CacheSpec spec = Spec({0, 0});
  std::vector<std::shared_ptr<GenericKvCacheHandle>> caches;
  std::vector<std::vector<KvHistory>> history;
  MakeCaches(spec, {8, 8, 8}, caches, history);  // page-aligned: the next step opens a page on each
  DecodeBatchOptions options;
  options.max_blocks = 8;
  auto made = DecodeBatch::Create(caches, options);
  ASSERT_THAT(made, IsOk());
  DecodeBatch& batch = **made;
  const int32_t* tables = batch.block_tables(0);
  Step(batch, caches, history);  // first Plan: every row written, 3 pages each
  EXPECT_EQ(batch.stats().sequences_rebuilt, 3 * 2);
  EXPECT_EQ(batch.stats().ids_written, 3 * 2 * 3);
  for (int step = 1; step < 4; ++step) Step(batch, caches, history);  // within the page
  EXPECT_EQ(batch.stats().ids_written, 3 * 2 * 3);
  Step(batch, caches, history);  // position 12: a new page on every sequence and layer
  EXPECT_EQ(batch.stats().ids_written, 3 * 2 * 4);
  EXPECT_EQ(batch.stats().sequences_rebuilt, 3 * 2);
  EXPECT_EQ(batch.stats().tables_moved, 0);
  EXPECT_EQ(batch.block_tables(0), tables) << "a fixed max_blocks keeps the tables in place";
  EXPECT_EQ(batch.stats().steps, 5);
  for (int layer = 0; layer < 2; ++layer) {
    for (int b = 0; b < 3; ++b) {
      auto t = caches[size_t(b)]->local_table(layer);
      ASSERT_THAT(t, IsOk());
      const int32_t* row = batch.block_tables(layer) + b * batch.max_blocks();
      std::vector<int32_t> want = t->page_ids;  // the last Plan was at position 12: 4 pages
      ASSERT_GE(want.size(), 4u);
      want.resize(4);
      want.resize(size_t(batch.max_blocks()), -1);
      EXPECT_EQ(std::vector<int32_t>(row, row + batch.max_blocks()), want);
      EXPECT_EQ(batch.first_block(layer, b), t->first_pos / kPageSize);
    }
  }
  // A popn reloads a cache's table; the next Plan rewrites only what differs.
  ASSERT_THAT(caches[1]->popn(1), IsOk());
  for (auto& h : history[1]) h.Truncate(h.len() - 1);
  Step(batch, caches, history);
  ExpectKv(caches, history);
}

// Growing tables move (doubling); a window eviction rewrites that row only.
TEST_F(DecodeBatchTest, TablesGrowAndFollowWindows) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  const CacheSpec spec = Spec({0, 5});
  std::vector<std::shared_ptr<GenericKvCacheHandle>> caches;
  std::vector<std::vector<KvHistory>> history;
  MakeCaches(spec, {2, 30}, caches, history);
  auto made = DecodeBatch::Create(caches);
  ASSERT_THAT(made, IsOk());
  DecodeBatch& batch = **made;
  for (int step = 0; step < 40; ++step) {
    Step(batch, caches, history);
    if (HasFailure()) return;
  }
  EXPECT_GE(batch.stats().tables_moved, 1);
  EXPECT_GE(batch.max_blocks(), (30 + 40 + kPageSize - 1) / kPageSize);
  // The sliding layer's rows moved with the window: rebuilt more than once per sequence.
  EXPECT_GT(batch.stats().sequences_rebuilt, 2 * 2);
  EXPECT_GT(batch.first_block(1, 1), 0);
  ExpectKv(caches, history);
}

// Kernels with only the single-cache calls (the CUDA kernels today): the batch runs
// through KvKernels' default loop, one call per sequence, with the same results.
class SingleCacheKernels final : public testing::ForwardingKvKernels {
 public:
  using ForwardingKvKernels::ForwardingKvKernels;
  absl::Status AppendKv(const PagedKvView& view, int64_t pos, int64_t n, const void* k,
                        const void* v) override {
    ++appends;
    return ForwardingKvKernels::AppendKv(view, pos, n, k, v);
  }
  absl::Status PagedAttention(const PagedKvView& view, const AttentionParams& params, const void* q,
                              void* out) override {
    ++attentions;
    return ForwardingKvKernels::PagedAttention(view, params, q, out);
  }
  static inline std::atomic<int> appends{0}, attentions{0};
};

TEST_F(DecodeBatchTest, KernelsWithoutBatchCallsRunItSequenceBySequence) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  client_internal::ClientTestPeer(*client_).WrapLocalKernels([](std::unique_ptr<KvKernels> k) {
    return std::make_unique<SingleCacheKernels>(std::move(k));
  });
  const CacheSpec spec = Spec({0, 3});
  std::vector<std::shared_ptr<GenericKvCacheHandle>> caches;
  std::vector<std::vector<KvHistory>> history;
  MakeCaches(spec, {0, 9, 2}, caches, history);
  DecodeBatchOptions options;
  options.tokens_per_step = 2;
  auto batch = DecodeBatch::Create(caches, options);
  ASSERT_THAT(batch, IsOk());
  const int appends = SingleCacheKernels::appends, attentions = SingleCacheKernels::attentions;
  for (int step = 0; step < 6; ++step) Step(**batch, caches, history);
  EXPECT_EQ(SingleCacheKernels::appends - appends, 6 * 2 * 3);
  EXPECT_EQ(SingleCacheKernels::attentions - attentions, 6 * 2 * 3);
  ExpectKv(caches, history);
}

TEST_F(DecodeBatchTest, CreateRefusesBatchesItCannotRun) {
  auto a = NewCache(Spec({0, 0})), b = NewCache(Spec({0, 0}));
  auto other_geometry = NewCache(Spec({0, 0}, 32));
  auto other_windows = NewCache(Spec({0, 6}));
  EXPECT_THAT(DecodeBatch::Create({}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no caches")));
  EXPECT_THAT(DecodeBatch::Create({a, nullptr}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("caches[1] is null")));
  EXPECT_THAT(DecodeBatch::Create({a, b, a}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("listed twice")));
  EXPECT_THAT(DecodeBatch::Create({a, other_geometry}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one pool")));
  EXPECT_THAT(DecodeBatch::Create({a, other_windows}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("windows [0, 6]")));
  auto view = a->with_sequence_length(0);
  ASSERT_THAT(view, IsOk());
  EXPECT_THAT(DecodeBatch::Create({*view}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("with_sequence_length")));
  ClientOptions options;
  options.arena_bytes = size_t{16} << 20;
  auto other = Client::Connect("inproc:", options);
  ASSERT_THAT(other, IsOk());
  auto foreign = (*other)->Allocate(Spec({0, 0}));
  ASSERT_THAT(foreign, IsOk());
  EXPECT_THAT(DecodeBatch::Create({a, *foreign}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("another Client")));
  for (int64_t n : {int64_t(0), int64_t(-1), std::numeric_limits<int64_t>::max()}) {
    DecodeBatchOptions o;
    o.tokens_per_step = n;
    EXPECT_THAT(DecodeBatch::Create({a}, o),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("tokens_per_step=", n))));
  }
  DecodeBatchOptions o;
  o.max_blocks = -5;
  EXPECT_THAT(DecodeBatch::Create({a}, o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_blocks=-5")));
  ASSERT_THAT(b->release(), IsOk());
  EXPECT_THAT(DecodeBatch::Create({a, b}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("released")));
}

// Each misuse is refused with the field and numbers, and leaves the caches as they were.
TEST_F(DecodeBatchTest, RefusalsNameTheFieldAndChangeNothing) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  const CacheSpec spec = Spec({0, 0});
  std::vector<std::shared_ptr<GenericKvCacheHandle>> caches;
  std::vector<std::vector<KvHistory>> history;
  MakeCaches(spec, {3, 5}, caches, history);
  auto made = DecodeBatch::Create(caches);
  ASSERT_THAT(made, IsOk());
  DecodeBatch& batch = **made;
  BatchTensor q = Random(kQHeads, 2, 1), k = Random(kKvHeads, 2, 1), v = Random(kKvHeads, 2, 1);
  std::string out(q.bytes.size(), '\0');
  const TensorBuffer buf{out.data(), out.size()};
  const auto kFailed = absl::StatusCode::kFailedPrecondition;
  const auto kInvalid = absl::StatusCode::kInvalidArgument;

  EXPECT_THAT(batch.Run(0, q.arg(), k.arg(), v.arg(), buf),
              StatusIs(kFailed, HasSubstr("call Plan first")));
  EXPECT_THAT(batch.Commit(), StatusIs(kFailed, HasSubstr("call Plan first")));
  ASSERT_THAT(batch.Plan(), IsOk());
  EXPECT_EQ(batch.position(0), 3);
  EXPECT_EQ(batch.position(1), 5);
  for (int layer : {-1, 2, std::numeric_limits<int>::max()}) {
    EXPECT_THAT(
        batch.Run(layer, q.arg(), k.arg(), v.arg(), buf),
        StatusIs(kInvalid, HasSubstr(absl::StrCat("layer=", layer, " but the caches have 2"))));
  }
  TensorArg bad = q.arg();
  bad.shape[0] = 3;
  EXPECT_THAT(batch.Run(0, bad, k.arg(), v.arg(), buf),
              StatusIs(kInvalid, HasSubstr("q: shape [3, 8, 1, 16] but want [batch=2")));
  bad = q.arg();
  bad.shape[1] = 3;  // not a multiple of the kv heads
  EXPECT_THAT(batch.Run(0, bad, k.arg(), v.arg(), buf),
              StatusIs(kInvalid, HasSubstr("q: shape [2, 3, 1, 16]")));
  bad = q.arg();
  bad.shape[2] = 2;
  EXPECT_THAT(batch.Run(0, bad, k.arg(), v.arg(), buf),
              StatusIs(kInvalid, HasSubstr("tokens_per_step=1")));
  bad = q.arg();
  bad.shape[1] = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(batch.Run(0, bad, k.arg(), v.arg(), buf), StatusIs(kInvalid));
  bad = q.arg();
  bad.dtype = DType::kBFloat16;
  EXPECT_THAT(batch.Run(0, bad, k.arg(), v.arg(), buf),
              StatusIs(kInvalid, HasSubstr("q: dtype bfloat16 but the caches hold float16")));
  bad = k.arg();
  bad.bytes -= 2;
  EXPECT_THAT(batch.Run(0, q.arg(), bad, v.arg(), buf),
              StatusIs(kInvalid, HasSubstr("k: 126 bytes")));
  bad = v.arg();
  bad.data = nullptr;
  EXPECT_THAT(batch.Run(0, q.arg(), k.arg(), bad, buf),
              StatusIs(kInvalid, HasSubstr("v: 128 bytes at null")));
  EXPECT_THAT(batch.Run(0, q.arg(), q.arg(), v.arg(), buf),
              StatusIs(kInvalid, HasSubstr("k: shape [2, 8, 1, 16]")));
  EXPECT_THAT(batch.Run(0, q.arg(), k.arg(), v.arg(), {out.data(), out.size() - 1}),
              StatusIs(kInvalid, HasSubstr("out: 511 bytes at a buffer but q is 512 bytes")));
  EXPECT_THAT(batch.Run(0, q.arg(), k.arg(), v.arg(), {nullptr, out.size()}),
              StatusIs(kInvalid, HasSubstr("out")));
  AttentionOptions opts;
  opts.scale = -1;
  EXPECT_THAT(batch.Run(0, q.arg(), k.arg(), v.arg(), buf, opts),
              StatusIs(kInvalid, HasSubstr("scale=-1")));
  opts.scale = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(batch.Run(0, q.arg(), k.arg(), v.arg(), buf, opts),
              StatusIs(kInvalid, HasSubstr("scale=nan")));
  // None of that wrote anything.
  for (const auto& h : caches) {
    auto t = h->local_table(0);
    ASSERT_THAT(t, IsOk());
    EXPECT_EQ(t->written, t->len) << h->cache_id();
  }

  ASSERT_THAT(batch.Run(0, q.arg(), k.arg(), v.arg(), buf), IsOk());
  EXPECT_THAT(batch.Run(0, q.arg(), k.arg(), v.arg(), buf),
              StatusIs(kFailed, HasSubstr("layer 0 already ran this step (at position 3")));
  EXPECT_THAT(batch.Commit(), StatusIs(kFailed, HasSubstr("layer 1 has not run this step")));
  EXPECT_THAT(batch.Plan(),
              StatusIs(kFailed, HasSubstr("layer 0 holds 1 uncommitted local tokens")));
  // A step abandoned half way: popn drops the uncommitted writes, and the next step runs.
  for (const auto& h : caches) ASSERT_THAT(h->popn(0), IsOk());
  Step(batch, caches, history);
  ExpectKv(caches, history);

  // A cache changed between Plan and Run is refused, not written.
  ASSERT_THAT(batch.Plan(), IsOk());
  ASSERT_THAT(caches[1]->popn(2), IsOk());
  for (auto& h : history[1]) h.Truncate(h.len() - 2);
  EXPECT_THAT(batch.Run(0, q.arg(), k.arg(), v.arg(), buf),
              StatusIs(kFailed, HasSubstr(absl::StrCat("cache ", caches[1]->cache_id(),
                                                       " layer 0 changed since Plan"))));
  Step(batch, caches, history);
  ASSERT_THAT(batch.Plan(), IsOk());
  ASSERT_THAT(caches[0]->release(), IsOk());
  EXPECT_THAT(batch.Append(0, k.arg(), v.arg()), StatusIs(kFailed, HasSubstr("released")));
  EXPECT_THAT(batch.Plan(), StatusIs(kFailed, HasSubstr("released")));
  caches.erase(caches.begin());
  history.erase(history.begin());
  ExpectKv(caches, history);
}

// RESOURCE_EXHAUSTED when the step does not fit (max_tokens, the fixed table width); the
// caches keep their lengths and a later step that fits runs.
TEST_F(DecodeBatchTest, PlanRefusesStepsThatDoNotFit) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  std::vector<std::shared_ptr<GenericKvCacheHandle>> caches = {NewCache(Spec({0}, kHeadDim, 6)),
                                                               NewCache(Spec({0}, kHeadDim, 0))};
  std::vector<std::vector<KvHistory>> history(
      2, std::vector<KvHistory>(1, KvHistory(kKvHeads, kHeadDim)));
  ASSERT_THAT(testing::PrefillLocal(*caches[0], history[0], 5, rng_), IsOk());
  ASSERT_THAT(testing::PrefillLocal(*caches[1], history[1], 5, rng_), IsOk());
  DecodeBatchOptions options;
  options.tokens_per_step = 2;
  auto made = DecodeBatch::Create(caches, options);
  ASSERT_THAT(made, IsOk());
  EXPECT_THAT((*made)->Plan(), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(caches[0]->num_tokens(), 5);
  EXPECT_EQ(caches[1]->num_tokens(), 5);

  options.tokens_per_step = 1;
  options.max_blocks = 2;
  made = DecodeBatch::Create(caches, options);
  ASSERT_THAT(made, IsOk());
  Step(**made, caches, history);  // position 5 -> 6: cache 0 is then full at max_tokens 6
  EXPECT_THAT((*made)->Plan(), StatusIs(absl::StatusCode::kResourceExhausted));
  history.erase(history.begin());
  caches.erase(caches.begin());
  made = DecodeBatch::Create(caches, options);
  ASSERT_THAT(made, IsOk());
  Step(**made, caches, history);  // 6 -> 7
  Step(**made, caches, history);  // 7 -> 8: 2 pages
  EXPECT_THAT((*made)->Plan(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("needs 3 pages for positions [0, 9) but options.max_blocks=2")));
  EXPECT_EQ(caches[0]->num_tokens(), 8);
  ExpectKv(caches, history);
}

}  // namespace
}  // namespace kvarena
