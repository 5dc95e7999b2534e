#include "core/kv_store.h"

#include <algorithm>

#include "core/store_fixture.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;
using Code = absl::StatusCode;

TEST_F(StoreTest, AllocateRejectsBadSpecs) {
  struct Case {
    const char* name;
    CacheSpec spec;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"zero layers", Spec(0, 2, 8), "spec.num_layers=0"},
      {"zero kv heads", Spec(2, 0, 8), "spec.num_kv_heads=0"},
      {"zero head_dim", Spec(2, 2, 0), "spec.head_dim=0"},
      {"unspecified dtype", Spec(2, 2, 8, DType::kUnspecified), "spec.dtype=0"},
      {"windows length", Spec(2, 2, 8, DType::kFloat32, {0, 0, 0}),
       "layer_windows has 3 entries but num_layers=2"},
      {"window of one", Spec(2, 2, 8, DType::kFloat32, {0, 1}), "layer_windows[1]=1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto r = store_->Allocate("", c.spec, "");
    EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
  }
  EXPECT_EQ(store_->Stats().num_caches, 0);
}

TEST_F(StoreTest, AllocateFillsDefaultsAndTakesNoPages) {
  CacheSpec s = Spec(3, 2, 8);
  s.page_size = 0;
  auto info = store_->Allocate("", s, "");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->spec.page_size, 4);
  EXPECT_EQ(info->spec.layer_windows, std::vector<int>(3, 0));
  EXPECT_EQ(info->page_bytes, 2u * 4 * 2 * 8 * 4);
  EXPECT_EQ(PagesUsed(), 0);
  EXPECT_THAT(store_->Allocate("", s, info->cache_id), StatusIs(Code::kAlreadyExists));
}

TEST_F(StoreTest, LayersMaterialiseOnFirstWrite) {
  const std::string id = Alloc(Spec(4, 2, 8));
  ASSERT_TRUE(AppendRandom(id, 2, 5).ok());
  const PageStats s = *store_->CacheStats(id);
  EXPECT_EQ(s.layers_materialized, 1);
  EXPECT_EQ(s.layers_total, 4);
  EXPECT_EQ(s.pages_used, 2);  // 5 tokens, page_size 4
  EXPECT_EQ(s.seq_len, 5);
}

TEST_F(StoreTest, AppendMustBeDense) {
  const std::string id = Alloc(Spec(2, 2, 8));
  ASSERT_TRUE(AppendRandom(id, 1, 10).ok());
  const Snapshot before = Snap(id);
  OwnedTensor k = RandomTensor(rng_, DType::kFloat32, 2, 1, 8);
  auto r = store_->Append("", id, 1, 12, k.Arg(), k.Arg());
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("append: pos=12 but layer 1 holds 10 tokens"));
  EXPECT_THAT(store_->Append("", id, 1, 9, k.Arg(), k.Arg()), StatusIs(Code::kInvalidArgument));
  EXPECT_TRUE(Snap(id) == before);
}

TEST_F(StoreTest, AppendRejectsBadTensorsAndChangesNothing) {
  const std::string id = Alloc(Spec(2, 2, 8));
  ASSERT_TRUE(AppendRandom(id, 0, 3).ok());
  const Snapshot before = Snap(id);
  OwnedTensor good = RandomTensor(rng_, DType::kFloat32, 2, 2, 8);
  OwnedTensor bf = RandomTensor(rng_, DType::kBFloat16, 2, 2, 8);
  OwnedTensor heads = RandomTensor(rng_, DType::kFloat32, 3, 2, 8);
  TensorArg short_bytes = good.Arg();
  short_bytes.bytes -= 4;
  TensorArg three_d = good.Arg();
  three_d.shape = {2, 2, 8};
  struct Case {
    const char* name;
    int layer;
    TensorArg k, v;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"dtype", 0, bf.Arg(), bf.Arg(), "k.dtype=bfloat16 but the cache holds float32"},
      {"heads", 0, heads.Arg(), heads.Arg(), "k.shape=[1, 3, 2, 8] must be [1, 2, tokens, 8]"},
      {"rank", 0, three_d, three_d, "k.shape=[2, 2, 8]"},
      {"bytes", 0, short_bytes, good.Arg(),
       "k has 124 bytes but shape [1, 2, 2, 8] of float32 needs 128"},
      {"layer", 2, good.Arg(), good.Arg(), "layer=2 but the cache has num_layers=2"},
      {"k vs v", 0, good.Arg(), RandomTensor(rng_, DType::kFloat32, 2, 3, 8).Arg(), ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto r = store_->Append("", id, c.layer, 3, c.k, c.v);
    EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
    EXPECT_TRUE(Snap(id) == before);
  }
}

TEST_F(StoreTest, MaxTokensRejectsAndWritesNothing) {
  const std::string id = Alloc(Spec(1, 2, 8, DType::kFloat32, {}, /*max_tokens=*/10));
  ASSERT_TRUE(AppendRandom(id, 0, 8).ok());
  const Snapshot before = Snap(id);
  auto r = AppendRandom(id, 0, 3);
  EXPECT_THAT(r, StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("would hold 11 tokens but max_tokens=10"));
  Snapshot after = Snap(id);
  EXPECT_EQ(after.cache.refusals, 1u);
  EXPECT_TRUE(after == before);
  EXPECT_TRUE(AppendRandom(id, 0, 2).ok());
}

TEST_F(StoreTest, FullArenaRejectsAndWritesNothing) {
  MakeStore(kChunkGranularity);  // page = 2*4*2*8*4 = 512 bytes -> 4096 pages
  const std::string id = Alloc(Spec(1, 2, 8));
  ASSERT_TRUE(AppendRandom(id, 0, 4095 * 4).ok());
  const Snapshot before = Snap(id);
  EXPECT_THAT(AppendRandom(id, 0, 8), StatusIs(Code::kResourceExhausted));
  EXPECT_TRUE(Snap(id) == before);
  EXPECT_TRUE(AppendRandom(id, 0, 4).ok());
  EXPECT_EQ(store_->Stats().pages.pages_free, 0);
}

TEST_F(StoreTest, GetKvReadsBackBitExact) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::string id = Alloc(Spec(2, 3, 16, dtype));
    OwnedTensor k = RandomTensor(rng_, dtype, 3, 11, 16);
    OwnedTensor v = RandomTensor(rng_, dtype, 3, 11, 16);
    ASSERT_TRUE(store_->Append("", id, 1, 0, k.Arg(), v.Arg()).ok());
    auto kv = store_->GetKv("", id, 1);
    ASSERT_TRUE(kv.ok());
    EXPECT_EQ(kv->first_pos, 0);
    EXPECT_EQ(kv->k.shape, (std::vector<int64_t>{1, 3, 11, 16}));
    EXPECT_EQ(kv->k.data, std::string(k.bytes.begin(), k.bytes.end()));
    EXPECT_EQ(kv->v.data, std::string(v.bytes.begin(), v.bytes.end()));
    auto empty = store_->GetKv("", id, 0);
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(empty->k.shape, (std::vector<int64_t>{1, 3, 0, 16}));
  }
}

TEST_F(StoreTest, ResetKeepPagesKeepsExactlyThePages) {
  const std::string id = Alloc(Spec(2, 2, 8));
  ASSERT_TRUE(AppendRandom(id, 0, 9).ok());
  ASSERT_TRUE(AppendRandom(id, 1, 4).ok());
  const auto pages = store_->Describe("", id)->layers;
  ASSERT_TRUE(store_->Reset("", id, /*keep_pages=*/true).ok());
  EXPECT_EQ(PagesUsed(), 4);
  const auto kept = store_->Describe("", id)->layers;
  EXPECT_EQ(kept[0].page_ids, pages[0].page_ids);
  EXPECT_EQ(kept[0].len, 0);
  refs_[id].assign(2, RefLayer{});
  ASSERT_TRUE(AppendRandom(id, 0, 12).ok());  // reuses the kept pages
  EXPECT_EQ(PagesUsed(), 4);
  EXPECT_EQ(store_->Describe("", id)->layers[0].page_ids, pages[0].page_ids);
  ExpectAttendMatches(id, 0, 11, 1, 4);
  ASSERT_TRUE(store_->Reset("", id, /*keep_pages=*/false).ok());
  EXPECT_EQ(PagesUsed(), 0);
  EXPECT_EQ(store_->CacheStats(id)->layers_materialized, 0);
}

TEST_F(StoreTest, ReleaseReturnsEveryPage) {
  const std::string a = Alloc(Spec(2, 2, 8));
  const std::string b = Alloc(Spec(1, 2, 8));
  ASSERT_TRUE(AppendRandom(a, 0, 9).ok());
  ASSERT_TRUE(AppendRandom(b, 0, 5).ok());
  ASSERT_TRUE(store_->Release("", a).ok());
  EXPECT_EQ(PagesUsed(), 2);
  EXPECT_THAT(store_->Release("", a), StatusIs(Code::kNotFound));
  EXPECT_THAT(store_->CacheStats(a), StatusIs(Code::kNotFound));
  EXPECT_THAT(AppendRandom(a, 0, 1), StatusIs(Code::kNotFound));
  EXPECT_EQ(store_->Stats().num_caches, 1);
  EXPECT_EQ(store_->Stats().pages.seq_len, 5);
}

// Pages of ListCaches come in id order, each cache once, wherever the ids were made;
// a cache released between pages does not shift the next page.
TEST_F(StoreTest, ListCachesPagesInIdOrder) {
  const std::vector<std::string> ids = {"g", "c", "a", "f", "b", "e", "d"};
  for (const std::string& id : ids) ASSERT_TRUE(store_->Allocate("", Spec(1, 1, 4), id).ok());
  KvStore::CachePage first = store_->ListCaches("", 3);
  ASSERT_EQ(first.caches.size(), 3u);
  EXPECT_EQ(first.caches[0].cache_id, "a");
  EXPECT_EQ(first.caches[2].cache_id, "c");
  EXPECT_EQ(first.last_id, "c");
  EXPECT_TRUE(first.more);
  ASSERT_TRUE(store_->Release("", "d").ok());  // the next page's first
  KvStore::CachePage second = store_->ListCaches(first.last_id, 3);
  ASSERT_EQ(second.caches.size(), 3u);
  EXPECT_EQ(second.caches[0].cache_id, "e");
  EXPECT_EQ(second.last_id, "g");
  EXPECT_FALSE(second.more);
  EXPECT_TRUE(store_->ListCaches("g", 3).caches.empty());
  // Exactly max_caches left: the page says no more remain.
  KvStore::CachePage exact = store_->ListCaches("d", 3);
  EXPECT_EQ(exact.caches.size(), 3u);
  EXPECT_FALSE(exact.more);
  std::vector<std::string> all;
  for (const CacheInfo& c : store_->ListCaches()) all.push_back(c.cache_id);
  EXPECT_EQ(all, (std::vector<std::string>{"a", "b", "c", "e", "f", "g"}));
}

// The ordered ids ListCaches pages through follow every way a cache comes (Allocate with
// or without an id, Fork) and goes (Release, a reaped session, --idle_ttl).
TEST_F(StoreTest, ListCachesFollowsEveryWayACacheComesAndGoes) {
  StoreOptions o = Options(size_t{64} << 20);
  o.idle_ttl = absl::Seconds(10);
  MakeStore(o);
  const auto listed = [&] {
    std::vector<std::string> ids;
    for (const CacheInfo& c : store_->ListCaches()) ids.push_back(c.cache_id);
    return ids;
  };
  const std::string session = *store_->OpenSession("w");
  ASSERT_TRUE(store_->Allocate(session, Spec(1, 1, 4), "s").ok());
  ASSERT_TRUE(store_->Allocate("", Spec(1, 1, 4), "b").ok());
  absl::StatusOr<CacheInfo> generated = store_->Allocate("", Spec(1, 1, 4), "");
  ASSERT_TRUE(generated.ok()) << generated.status();
  ASSERT_TRUE(store_->Fork("", "b", "a").ok());
  ASSERT_TRUE(store_->Allocate("", Spec(1, 1, 4), "r").ok());
  std::vector<std::string> expected = {"a", "b", generated->cache_id, "r", "s"};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(listed(), expected);
  ASSERT_TRUE(store_->Release("", "r").ok());
  store_->DetachSession(session, absl::ZeroDuration());
  EXPECT_EQ(store_->Reap(), 1);  // the session's "s"
  EXPECT_EQ(listed(), (std::vector<std::string>{"a", "b", generated->cache_id}));
  clock_.Advance(absl::Seconds(5));
  ASSERT_TRUE(store_->Describe("", "a").ok());
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(store_->Reap(), 2);  // "b" and the generated one, idle; "a" was just used
  EXPECT_EQ(listed(), (std::vector<std::string>{"a"}));
  KvStore::CachePage page = store_->ListCaches("", 1);
  EXPECT_EQ(page.last_id, "a");
  EXPECT_FALSE(page.more);
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok());
}

TEST_F(StoreTest, AttendAppendsThenAttendsCausally) {
  const std::string id = Alloc(Spec(1, 2, 8));
  ASSERT_TRUE(AppendRandom(id, 0, 6).ok());
  const CacheSpec& s = specs_[id];
  OwnedTensor q = RandomTensor(rng_, s.dtype, 4, 3, 8);
  OwnedTensor k = RandomTensor(rng_, s.dtype, 2, 3, 8);
  OwnedTensor v = RandomTensor(rng_, s.dtype, 2, 3, 8);
  std::vector<uint8_t> out(q.bytes.size());
  AttendArgs a{id, 0, 6, q.Arg(), k.Arg(), v.Arg(), 0.3, 0};
  auto r = store_->Attend("", a, out.data(), out.size());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->seq_len, 9);
  Record(refs_[id][0], k, v);
  const auto want = ReferenceAttention(refs_[id][0], q, 6, 2, 0.3, 0);
  const auto got = testing::DecodeValues(s.dtype, out.data(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4);
}

TEST_F(StoreTest, AttendRejectsBadQueriesAndChangesNothing) {
  const std::string id = Alloc(Spec(1, 2, 8));
  ASSERT_TRUE(AppendRandom(id, 0, 6).ok());
  const Snapshot before = Snap(id);
  OwnedTensor q3 = RandomTensor(rng_, DType::kFloat32, 3, 1, 8);
  OwnedTensor q = RandomTensor(rng_, DType::kFloat32, 4, 1, 8);
  OwnedTensor k = RandomTensor(rng_, DType::kFloat32, 2, 1, 8);
  std::vector<uint8_t> out(q.bytes.size());
  auto call = [&](AttendArgs a, size_t out_bytes) {
    return store_->Attend("", a, out.data(), out_bytes);
  };
  EXPECT_THAT(call({id, 0, 5, q3.Arg(), {}, {}, 0, 0}, q3.bytes.size()),
              StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(call({id, 0, 5, q.Arg(), {}, {}, 0, 0}, 4), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(call({id, 0, 6, q.Arg(), {}, {}, 0, 0}, out.size()),
              StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(call({id, 0, 6, q.Arg(), k.Arg(), {}, 0, 0}, out.size()),
              StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(call({id, 0, 5, q.Arg(), k.Arg(), k.Arg(), 0, 0}, out.size()),
              StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(call({id, 0, 5, q.Arg(), {}, {}, -1.0, 0}, out.size()),
              StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(call({"nope", 0, 5, q.Arg(), {}, {}, 0, 0}, out.size()), StatusIs(Code::kNotFound));
  EXPECT_TRUE(Snap(id) == before);
}

TEST_F(StoreTest, CallWindowMasksKeysStillCached) {
  const std::string id = Alloc(Spec(1, 2, 8));
  ASSERT_TRUE(AppendRandom(id, 0, 20).ok());
  ExpectAttendMatches(id, 0, 19, 1, 2, /*window=*/5);
  ExpectAttendMatches(id, 0, 10, 4, 4, /*window=*/3);
}

TEST_F(StoreTest, SlidingLayerEvictsPagesOutsideTheWindow) {
  const std::string id = Alloc(Spec(2, 2, 8, DType::kFloat32, {0, 5}));
  for (int t = 0; t < 40; ++t) {
    ASSERT_TRUE(AppendRandom(id, 0, 1).ok());
    ASSERT_TRUE(AppendRandom(id, 1, 1).ok());
    ExpectAttendMatches(id, 1, t, 1, 2);
  }
  const auto layers = store_->Describe("", id)->layers;
  EXPECT_EQ(layers[0].page_ids.size(), 10u);
  EXPECT_LE(layers[1].page_ids.size(), 3u);  // keys (34, 39] span at most 3 pages of 4
  EXPECT_GT(layers[1].first_pos, 0);
  EXPECT_GT(store_->CacheStats(id)->pages_evicted, 0u);
  auto kv = store_->GetKv("", id, 1);
  EXPECT_EQ(kv->first_pos, layers[1].first_pos);
  EXPECT_EQ(kv->k.shape[2], 40 - layers[1].first_pos);
  // A query whose window reaches evicted keys is refused, not answered wrongly.
  OwnedTensor q = RandomTensor(rng_, DType::kFloat32, 2, 1, 8);
  std::vector<uint8_t> out(q.bytes.size());
  AttendArgs a{id, 1, 10, q.Arg(), {}, {}, 0, 0};
  EXPECT_THAT(store_->Attend("", a, out.data(), out.size()), StatusIs(Code::kFailedPrecondition));
}

TEST_F(StoreTest, ArenaStatsTotalEveryPool) {
  const std::string a = Alloc(Spec(1, 2, 8));
  const std::string b = Alloc(Spec(1, 2, 8, DType::kBFloat16));
  ASSERT_TRUE(AppendRandom(a, 0, 5).ok());
  ASSERT_TRUE(AppendRandom(b, 0, 9).ok());
  const ArenaStats s = store_->Stats();
  EXPECT_EQ(s.backend, "host");
  EXPECT_EQ(s.pools.size(), 2u);
  EXPECT_EQ(s.pages.pages_used, 5);
  EXPECT_EQ(s.pages.seq_len, 14);
  EXPECT_EQ(s.pages.layers_total, 2);
  EXPECT_EQ(s.pages.layers_materialized, 2);
  EXPECT_EQ(s.bytes_used, 2u * 512 + 3u * 256);
  EXPECT_EQ(s.pages.page_size, 4);
  EXPECT_EQ(s.num_caches, 2);
  EXPECT_EQ(s.pools[0].num_caches, 1);
}

}  // namespace
}  // namespace kvarena

namespace kvarena {
namespace {

// An int8 cache through the served path (docs/client.md "KV formats"): its pages hold a
// token of each head in head_dim bytes and a float32 scale; GetKv reads every value within
// half a quantization step of what was appended, and Attend matches the float64 reference
// over those values exactly as a 16-bit cache matches its own (the kernels add nothing
// beyond the format), and the reference over the values appended within the format's error.
TEST_F(StoreTest, Int8CacheServesWithinTheFormatsError) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  CacheSpec spec = Spec(2, 2, 16, DType::kFloat32);
  spec.kv_format = KvFormat::kInt8;
  const std::string id = Alloc(spec);
  ASSERT_FALSE(id.empty());
  auto info = store_->Describe("", id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->info.spec.kv_format, KvFormat::kInt8);
  EXPECT_EQ(info->info.page_bytes, 2u * 4 * (2 * 16 + 2 * 4));  // vs 2 * 4 * 2 * 16 * 4 = 1024
  ASSERT_TRUE(AppendRandom(id, 0, 23).ok());
  ASSERT_TRUE(AppendRandom(id, 0, 2).ok());

  auto kv = store_->GetKv("", id, 0);
  ASSERT_TRUE(kv.ok()) << kv.status();
  ASSERT_EQ(kv->k.dtype, DType::kFloat32);
  const std::vector<double> k = testing::DecodeValues(kv->k.data, DType::kFloat32);
  const std::vector<double> v = testing::DecodeValues(kv->v.data, DType::kFloat32);
  const RefLayer& appended = refs_[id][0];
  RefLayer stored;  // what the pages hold, dequantized
  stored.k.assign(25, std::vector<double>(32));
  stored.v = stored.k;
  for (int h = 0; h < 2; ++h) {
    for (int t = 0; t < 25; ++t) {
      for (int kvi = 0; kvi < 2; ++kvi) {
        const std::vector<double>& x = (kvi == 0 ? appended.k : appended.v)[size_t(t)];
        double amax = 0;
        for (int d = 0; d < 16; ++d) amax = std::max(amax, std::fabs(x[size_t(h * 16 + d)]));
        for (int d = 0; d < 16; ++d) {
          const double got = (kvi == 0 ? k : v)[size_t((h * 25 + t) * 16 + d)];
          ASSERT_LE(std::fabs(got - x[size_t(h * 16 + d)]), amax / 127 / 2 * (1 + 1e-5))
              << "kv " << kvi << " head " << h << " token " << t << " dim " << d;
          (kvi == 0 ? stored.k : stored.v)[size_t(t)][size_t(h * 16 + d)] = got;
        }
      }
    }
  }

  OwnedTensor q = RandomTensor(rng_, DType::kFloat32, 4, 3, 16);
  std::vector<uint8_t> out(q.bytes.size());
  AttendArgs a;
  a.cache_id = id;
  a.layer = 0;
  a.pos = 22;
  a.q = q.Arg();
  ASSERT_TRUE(store_->Attend("", a, out.data(), out.size()).ok());
  const std::vector<double> got =
      testing::DecodeValues(DType::kFloat32, out.data(), out.size() / 4);
  const double scale = 1.0 / 4;  // 1 / sqrt(head_dim)
  const std::vector<double> exact = ReferenceAttention(stored, q, 22, 2, scale, 0);
  const std::vector<double> original = ReferenceAttention(appended, q, 22, 2, scale, 0);
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], exact[i], 1e-5) << "element " << i;
    worst = std::max(worst, std::fabs(got[i] - original[i]));
  }
  std::printf("int8 attention: largest difference from the unquantized reference %.2e\n", worst);
  EXPECT_LT(worst, 0.02);  // values in [-1, 1]: a step of at most 1/127 per value
}

TEST_F(StoreTest, AFormatTheKernelsDoNotServeIsRefusedByName) {
  CacheSpec f16_pages = Spec(2, 2, 8, DType::kFloat32);
  f16_pages.kv_format = KvFormat::kFloat16;
  auto r = store_->Allocate("", f16_pages, "");
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("spec.kv_format=float16 with spec.dtype=float32: the cpu kernels store "
                        "K/V as the activation dtype or as int8, fp8_e4m3 only"));
  CacheSpec unknown = Spec(2, 2, 8);
  unknown.kv_format = KvFormat(200);
  r = store_->Allocate("", unknown, "");
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("spec.kv_format=200"));
  EXPECT_EQ(store_->Stats().num_caches, 0);
}

}  // namespace
}  // namespace kvarena
