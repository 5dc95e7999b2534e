// Prefix reuse in the store: content-addressed full pages, adoption at Allocate,
// namespaces, collisions, SetTokens, the cached pages and their reclaiming, and sliding
// layers, with TEST_CheckInvariants after every step (the fixture: prefix_fixture.h).
#include <xxhash.h>

#include "core/prefix_fixture.h"
#include "core/prefix_hash.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;

TEST(PrefixHashTest, IsXxh3OverTheDocumentedBytes) {
  // The XXH3-128 test vector, so a different algorithm behind the same name shows.
  const XXH128_hash_t abc = XXH3_128bits("abc", 3);
  EXPECT_EQ(abc.high64, 0x06b05ab6733a6185u);
  EXPECT_EQ(abc.low64, 0x78af5f94892f3950u);

  CacheSpec s = PrefixSpec("m");
  s.dtype = DType::kFloat16;
  std::string root = "kvarena.prefix.v3";
  auto u32 = [](std::string* b, uint32_t v) {
    for (int i = 0; i < 4; ++i) b->push_back(char(v >> (8 * i)));
  };
  u32(&root, 1);
  root += "m";
  // dtype, kv_format (the dtype's own), scales (none), page, heads, dim, layers
  for (uint32_t v : {2u, 2u, 0u, 4u, 2u, 8u, 2u}) u32(&root, v);
  u32(&root, 0);  // scales_digest, u64: 0 without static scales
  u32(&root, 0);
  u32(&root, 0);  // the windows of the 2 layers: unset, global
  u32(&root, 0);
  const XXH128_hash_t r = XXH3_128bits(root.data(), root.size());
  EXPECT_EQ(PrefixRootHash("m", s), (Hash128{r.low64, r.high64}));

  const int32_t tokens[4] = {1, 2, 3, -5};
  std::string page;
  for (int i = 0; i < 8; ++i) page.push_back(char(r.low64 >> (8 * i)));
  for (int i = 0; i < 8; ++i) page.push_back(char(r.high64 >> (8 * i)));
  for (int32_t t : tokens) u32(&page, uint32_t(t));
  const XXH128_hash_t p = XXH3_128bits(page.data(), page.size());
  EXPECT_EQ(PrefixPageHash(PrefixRootHash("m", s), tokens, 4), (Hash128{p.low64, p.high64}));
  // Every process and version computes this same value (the format is part of the contract).
  EXPECT_EQ(PrefixRootHash("m", s).Hex(), Hash128({r.low64, r.high64}).Hex());
  EXPECT_NE(PrefixRootHash("m", s), PrefixRootHash("n", s));
  EXPECT_EQ(KeepHashBits(Hash128{~0ull, ~0ull}, 0), Hash128{});
  EXPECT_EQ(KeepHashBits(Hash128{~0ull, ~0ull}, 70), (Hash128{~0ull, 63}));
}

TEST_F(PrefixTest, SecondCacheAdoptsThePageAlignedPrefixAndMatchesBitForBit) {
  const std::vector<int32_t> prompt = Tokens(10);
  auto a = AllocPrompt(PrefixSpec("model-a"), prompt);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->cached_tokens, 0);
  EXPECT_EQ(a->tokens_known, 10);
  Compute(a->cache_id, prompt, 0);
  const int64_t one = PagesUsed();  // 3 pages per layer

  auto b = AllocPrompt(PrefixSpec("model-a"), prompt);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cached_tokens, 8);  // two full pages; the last position is always computed
  EXPECT_EQ(b->seq_len, 8);
  EXPECT_EQ(b->layer_lens, (std::vector<int64_t>{8, 8}));
  ExpectInvariants();
  for (int l = 0; l < kLayers; ++l) EXPECT_EQ(Kv(b->cache_id, l), Expected(prompt, l, 0, 8));
  Compute(b->cache_id, prompt, 8);
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(Kv(b->cache_id, l), Kv(a->cache_id, l));
    EXPECT_EQ(Attend(b->cache_id, l, 8, 2), Attend(a->cache_id, l, 8, 2));
  }
  const ArenaStats st = store_->Stats();
  EXPECT_EQ(st.pages.pages_used, one + kLayers);  // B's own: the partial last page per layer
  EXPECT_EQ(st.pages.pages_shared, 2 * kLayers);
  EXPECT_EQ(st.pages.prefix_lookups, 2u);
  EXPECT_EQ(st.pages.prefix_requested_tokens, 20u);
  EXPECT_EQ(st.pages.prefix_hit_tokens, 8u);
  EXPECT_EQ(store_->CacheStats(b->cache_id)->pages_used,
            3 * kLayers);  // it references all it reads
  ExpectInvariants();
}

TEST_F(PrefixTest, OnlyOneNamespaceAndGeometryShare) {
  const std::vector<int32_t> prompt = Tokens(9);
  auto a = AllocPrompt(PrefixSpec("m"), prompt);
  Compute(a->cache_id, prompt, 0);
  EXPECT_EQ(AllocPrompt(PrefixSpec(""), prompt)->cached_tokens, 0);    // empty shares nothing
  EXPECT_EQ(AllocPrompt(PrefixSpec("m2"), prompt)->cached_tokens, 0);  // another namespace
  CacheSpec layers3 = PrefixSpec("m");
  layers3.num_layers = 3;
  EXPECT_EQ(AllocPrompt(layers3, prompt)->cached_tokens, 0);  // another geometry
  CacheSpec f16 = PrefixSpec("m");
  f16.dtype = DType::kBFloat16;
  EXPECT_EQ(AllocPrompt(f16, prompt)->cached_tokens, 0);
  CacheSpec int8 = PrefixSpec("m");
  int8.kv_format = KvFormat::kInt8;  // same dtype, same geometry, another KV format
  EXPECT_EQ(AllocPrompt(int8, prompt)->cached_tokens, 0);
  // A sliding layer: its window changes the K/V of every layer after it.
  EXPECT_EQ(AllocPrompt(PrefixSpec("m", {0, 6}), prompt)->cached_tokens, 0);
  EXPECT_EQ(AllocPrompt(PrefixSpec("m", {0, 0}), prompt)->cached_tokens, 8);  // unset: global
  EXPECT_EQ(AllocPrompt(PrefixSpec("m"), prompt)->cached_tokens, 8);
  // Without a namespace nothing is registered either.
  auto c = AllocPrompt(PrefixSpec(""), prompt);
  Compute(c->cache_id, prompt, 0);
  EXPECT_EQ(AllocPrompt(PrefixSpec(""), prompt)->cached_tokens, 0);
  ExpectInvariants();
}

// fp8's static scales are part of the identity: a cache one of whose K or V scales differs
// adopts nothing, unset scales and explicit 1s are one identity, and Allocate states them.
TEST_F(PrefixTest, Fp8PagesAreSharedOnlyUnderTheSameStaticScales) {
  const std::vector<int32_t> prompt = Tokens(9);
  CacheSpec fp8 = PrefixSpec("m");
  fp8.kv_format = KvFormat::kFp8E4M3;
  auto a = AllocPrompt(fp8, prompt);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::vector<float> ones(size_t(kLayers * kHeads), 1.0f);
  EXPECT_EQ(a->spec.k_scales, ones);
  EXPECT_EQ(a->spec.v_scales, ones);
  Compute(a->cache_id, prompt, 0);
  CacheSpec explicit_ones = fp8;
  explicit_ones.k_scales = ones;
  explicit_ones.v_scales = ones;
  EXPECT_EQ(AllocPrompt(explicit_ones, prompt)->cached_tokens, 8);
  for (std::vector<float> CacheSpec::*scales : {&CacheSpec::k_scales, &CacheSpec::v_scales}) {
    for (size_t i : {size_t(0), ones.size() - 1}) {
      CacheSpec other = explicit_ones;
      (other.*scales)[i] = 0.5f;
      SCOPED_TRACE(::testing::Message()
                   << (scales == &CacheSpec::k_scales ? "k" : "v") << "_scales[" << i << "]");
      EXPECT_EQ(AllocPrompt(other, prompt)->cached_tokens, 0);
    }
  }
  EXPECT_EQ(AllocPrompt(PrefixSpec("m"), prompt)->cached_tokens, 0);  // float32 pages
  EXPECT_EQ(AllocPrompt(fp8, prompt)->cached_tokens, 8);
  ExpectInvariants();
}

TEST_F(PrefixTest, ADifferingTokenSharesOnlyThePagesBeforeIt) {
  const std::vector<int32_t> prompt = Tokens(17);
  auto a = AllocPrompt(PrefixSpec("m"), prompt);
  Compute(a->cache_id, prompt, 0);
  std::vector<int32_t> other = prompt;
  other[9] = 5;  // in the third page
  auto b = AllocPrompt(PrefixSpec("m"), other);
  EXPECT_EQ(b->cached_tokens, 8);
  other[0] = 6;
  EXPECT_EQ(AllocPrompt(PrefixSpec("m"), other)->cached_tokens, 0);
  std::vector<int32_t> longer = prompt;
  longer.insert(longer.end(), {1, 2, 3, 4, 5});
  EXPECT_EQ(AllocPrompt(PrefixSpec("m"), longer)->cached_tokens, 16);
  EXPECT_EQ(AllocPrompt(PrefixSpec("m"), Tokens(8))->cached_tokens, 4);  // a page-exact prompt
  EXPECT_EQ(AllocPrompt(PrefixSpec("m"), Tokens(1))->cached_tokens, 0);
  ExpectInvariants();
}

TEST_F(PrefixTest, ForcedCollisionsAreRejectedByTheTokenCheck) {
  StoreOptions o = Options(size_t{64} << 20);
  o.TEST_prefix_hash_bits = 0;  // every page hash collides with every other
  MakeStore(o);
  const std::vector<int32_t> prompt = Tokens(13);
  auto a = AllocPrompt(PrefixSpec("m"), prompt);
  Compute(a->cache_id, prompt, 0);
  std::vector<int32_t> other = Tokens(13, 7);  // same hashes, other tokens
  auto b = AllocPrompt(PrefixSpec("m"), other);
  EXPECT_EQ(b->cached_tokens, 0);
  Compute(b->cache_id, other, 0);
  for (int l = 0; l < kLayers; ++l) EXPECT_EQ(Kv(b->cache_id, l), Expected(other, l, 0, 13));
  // The same prompt hits its first page only: its second page's hash names the first.
  EXPECT_EQ(AllocPrompt(PrefixSpec("m"), prompt)->cached_tokens, 4);
  // And b's prompt, whose first page collided, registered nothing.
  EXPECT_EQ(AllocPrompt(PrefixSpec("m"), other)->cached_tokens, 0);
  ExpectInvariants();
}

TEST_F(PrefixTest, ReleasedPagesStayCachedUntilAdopted) {
  const std::vector<int32_t> prompt = Tokens(14);
  auto a = AllocPrompt(PrefixSpec("m"), prompt);
  Compute(a->cache_id, prompt, 0);
  ASSERT_TRUE(store_->Release("", a->cache_id).ok());
  ArenaStats st = store_->Stats();
  EXPECT_EQ(st.pages.pages_used, 0);
  EXPECT_EQ(st.pages.pages_cached, 3 * kLayers);  // the full pages; the partial one is free
  EXPECT_EQ(st.pools.size(), 1u);                 // kept for them
  ExpectInvariants();
  auto b = AllocPrompt(PrefixSpec("m"), prompt);
  EXPECT_EQ(b->cached_tokens, 12);
  st = store_->Stats();
  EXPECT_EQ(st.pages.pages_cached, 0);
  EXPECT_EQ(st.pages.pages_used, 3 * kLayers);
  for (int l = 0; l < kLayers; ++l) EXPECT_EQ(Kv(b->cache_id, l), Expected(prompt, l, 0, 12));
  ASSERT_TRUE(store_->Reset("", b->cache_id, /*keep_pages=*/true).ok());
  EXPECT_EQ(store_->Stats().pages.pages_cached,
            3 * kLayers);  // shared pages are not kept for writing
  EXPECT_EQ(store_->CacheStats(b->cache_id)->pages_used, 0);
  ExpectInvariants();
}

TEST_F(PrefixTest, AllocationReclaimsCachedPagesTailFirstBeforeRefusing) {
  MakeStore(kChunkGranularity);  // one chunk: 2 MiB / 256 B = 8192 pages of this geometry
  const PoolStats pool0 = [&] {
    auto c = AllocPrompt(PrefixSpec("m"), {});
    Compute(c->cache_id, Tokens(1), 0);
    PoolStats p = store_->Stats().pools[0];
    EXPECT_TRUE(store_->Release("", c->cache_id).ok());
    return p;
  }();
  const int64_t total = pool0.num_pages;
  const std::vector<int32_t> prompt = Tokens(41);  // 10 full pages per layer
  auto a = AllocPrompt(PrefixSpec("m"), prompt);
  Compute(a->cache_id, prompt, 0);
  ASSERT_TRUE(store_->Release("", a->cache_id).ok());
  EXPECT_EQ(store_->Stats().pages.pages_cached, 20);
  // Fill all free pages, then 6 more: they come from the LRU, deepest pages first.
  auto big = AllocPrompt(PrefixSpec(""), {});
  const int64_t free_now = total - 20;
  OwnedTensor k = RandomTensor(rng_, DType::kFloat32, kHeads, (free_now + 6) * kPage, kDim);
  ASSERT_TRUE(store_->Append("", big->cache_id, 0, 0, k.Arg(), k.Arg()).ok());
  ArenaStats st = store_->Stats();
  EXPECT_EQ(st.pages.pages_cached, 14);
  EXPECT_EQ(st.pages.pages_evicted_lru, 6u);
  ExpectInvariants();
  // The head survived: the prompt still hits 7 pages (3 were reclaimed on each layer).
  auto b = AllocPrompt(PrefixSpec("m"), prompt);
  EXPECT_EQ(b->cached_tokens, 7 * kPage);
  for (int l = 0; l < kLayers; ++l)
    EXPECT_EQ(Kv(b->cache_id, l), Expected(prompt, l, 0, 7 * kPage));
  ASSERT_TRUE(store_->Release("", b->cache_id).ok());
  // Past every cached page the arena refuses, and the refusal reclaims nothing.
  OwnedTensor more = RandomTensor(rng_, DType::kFloat32, kHeads, 15 * kPage, kDim);
  const std::string before = store_->TEST_DebugState();
  EXPECT_THAT(store_->Append("", big->cache_id, 1, 0, more.Arg(), more.Arg()),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(store_->TEST_DebugState(), before);
  EXPECT_EQ(store_->Stats().pages.pages_cached, 14);
  OwnedTensor fits = RandomTensor(rng_, DType::kFloat32, kHeads, 14 * kPage, kDim);
  EXPECT_TRUE(store_->Append("", big->cache_id, 1, 0, fits.Arg(), fits.Arg()).ok());
  EXPECT_EQ(store_->Stats().pages.pages_cached, 0);
  ExpectInvariants();
}

TEST_F(PrefixTest, AnotherPoolsAllocationTrimsAnIdlePoolsCachedPages) {
  MakeStore(2 * kChunkGranularity);
  const std::vector<int32_t> prompt = Tokens(4 * 600 + 1);
  auto a = AllocPrompt(PrefixSpec("m"), prompt);
  Compute(a->cache_id, prompt, 0);
  ASSERT_TRUE(store_->Release("", a->cache_id).ok());
  ASSERT_EQ(store_->Stats().pages.pages_cached, 1200);
  // Another geometry needs both chunks: the idle pool gives its cached pages back.
  CacheSpec wide = Spec(1, 8, 64, DType::kFloat32, {}, 0, 16);  // 64 KiB pages
  auto w = store_->Allocate("", wide, "");
  ASSERT_TRUE(w.ok());
  OwnedTensor k = RandomTensor(rng_, DType::kFloat32, 8, 16 * 60, 64);
  auto r = store_->Append("", w->cache_id, 0, 0, k.Arg(), k.Arg());
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_LT(store_->Stats().pages.pages_cached, 1200);
  EXPECT_GT(store_->Stats().pages.pages_evicted_lru, 0u);
  ExpectInvariants();
}

TEST_F(PrefixTest, SetTokensLetsALaterTurnHitTheAnswer) {
  std::vector<int32_t> turn = Tokens(6);
  auto a = AllocPrompt(PrefixSpec("m"), turn);
  Compute(a->cache_id, turn, 0);
  // Decode 7 tokens: each one's K/V appended, its id declared.
  for (int32_t t = 0; t < 7; ++t) {
    turn.push_back(900 + t);
    auto info =
        store_->SetTokens("", SetTokensArgs{a->cache_id, int64_t(turn.size()) - 1, {turn.back()}});
    ASSERT_TRUE(info.ok()) << info.status();
    Compute(a->cache_id, turn, int64_t(turn.size()) - 1);
  }
  std::vector<int32_t> next = turn;
  next.insert(next.end(), {1, 2, 3});
  auto b = AllocPrompt(PrefixSpec("m"), next);
  EXPECT_EQ(b->cached_tokens, 12);
  for (int l = 0; l < kLayers; ++l) EXPECT_EQ(Kv(b->cache_id, l), Expected(next, l, 0, 12));
  ExpectInvariants();
}

TEST_F(PrefixTest, SetTokensRefusalsChangeNothing) {
  const std::vector<int32_t> prompt = Tokens(6);
  auto a = AllocPrompt(PrefixSpec("m"), prompt);
  Compute(a->cache_id, prompt, 0);
  const std::string before = store_->TEST_DebugState();
  auto set = [&](int64_t first, std::vector<int32_t> ids) {
    return store_->SetTokens("", SetTokensArgs{a->cache_id, first, std::move(ids)});
  };
  EXPECT_THAT(set(7, {1}), StatusIs(absl::StatusCode::kInvalidArgument));  // a gap
  EXPECT_THAT(set(-1, {1}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(set(6, {1, -2}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(set(6, std::vector<int32_t>(size_t(1 << 20) + 1, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto changed = set(2, {1});  // position 2 holds prompt[2] and K/V
  EXPECT_THAT(changed, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(changed.status().message(), HasSubstr("position 2"));
  EXPECT_THAT(store_->SetTokens("", SetTokensArgs{"nope", 0, {1}}),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(store_->TEST_DebugState(), before);
  // Re-declaring what is known is fine; unwritten positions may change.
  EXPECT_TRUE(set(0, prompt).ok());
  EXPECT_EQ(set(6, {1, 2, 3})->tokens_known, 9);
  EXPECT_EQ(set(7, {4})->tokens_known, 8);  // position 8 followed the old 7: forgotten
  EXPECT_THAT(AllocPrompt(PrefixSpec("m"), {1, -1}), StatusIs(absl::StatusCode::kInvalidArgument));
  ExpectInvariants();
}

TEST_F(PrefixTest, SlidingLayersNeedOnlyThePagesTheirWindowSees) {
  const CacheSpec spec = PrefixSpec("m", {0, 4});
  const std::vector<int32_t> prompt = Tokens(17);
  // Decoded one token at a time with no ids declared: layer 1's early pages are evicted
  // (and freed) before its tokens are known, so only what the window kept is registered.
  auto a = AllocPrompt(spec, {});
  for (int64_t p = 0; p < 17; ++p)
    Compute(a->cache_id, std::vector<int32_t>(prompt.begin(), prompt.begin() + p + 1), p);
  ASSERT_EQ(store_->Describe("", a->cache_id)->layers[1].first_pos, 12);
  ASSERT_TRUE(store_->SetTokens("", SetTokensArgs{a->cache_id, 0, prompt}).ok());
  std::vector<int32_t> next = prompt;
  next.push_back(3);
  auto b = AllocPrompt(spec, next);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->cached_tokens, 16);
  auto d = store_->Describe("", b->cache_id);
  EXPECT_EQ(d->layers[0].page_ids.size(), 4u);
  EXPECT_EQ(d->layers[1].first_pos, 12);  // the window from position 16 sees 13..16
  EXPECT_EQ(d->layers[1].page_ids.size(), 1u);
  Compute(b->cache_id, next, 16);
  EXPECT_EQ(Kv(b->cache_id, 1), Expected(next, 1, 12, 18));
  ExpectInvariants();
}

}  // namespace
}  // namespace kvarena
