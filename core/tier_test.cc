// The tiers below the arena in one process (core/tier_set.h, docs/tiers.md): a prefix the
// arena evicts goes down as chunks and comes back, bit for bit, into a new cache; what a
// store hands back is verified first; events say where a page is; the audit covers what
// the tiers add. The stores here are an in-memory map with knobs to fail
// (core/map_tier_store.h; the real host and disk stores have their own tests in tiers/,
// and tests/daemon/tiers_test.cc runs them in kvarenad).
#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "core/map_tier_store.h"
#include "core/prefix_fixture.h"
#include "core/prefix_index.h"
#include "core/tier_set.h"
#include "gmock/gmock.h"
#include "tests/support/status_matchers.h"

namespace kvarena {
namespace {

using ::kvarena::testing::IsOk;
using ::kvarena::testing::StatusIs;
using ::testing::HasSubstr;

// One store, as a list for TierSet (an initializer list would copy its unique_ptr).
std::vector<TierEntry> OneStore(std::string medium, bool write_through = false) {
  std::vector<TierEntry> v;
  v.push_back(TierEntry{std::make_unique<MapStore>(std::move(medium)), write_through});
  return v;
}

// Page bytes: 2 (K, V) x 4 tokens x 2 heads x 8 dims x 4 bytes = 512; a chunk of 2 pages.
constexpr int kChunkPages = 2;

class TierTest : public PrefixTest {
 protected:
  void SetUp() override { Start(OneStore("host")); }

  // A store whose arena holds `arena_pages` pages of the prefix geometry.
  void Start(std::vector<TierEntry> stores, int chunk_pages = kChunkPages,
             size_t arena_bytes = kChunkGranularity) {
    stores_.clear();
    for (const TierEntry& e : stores) stores_.push_back(static_cast<MapStore*>(e.store.get()));
    TierOptions t;
    t.chunk_pages = chunk_pages;
    tiers_ = std::make_shared<TierSet>(std::move(stores), t);
    StoreOptions o = Options(arena_bytes);  // by default one chunk: 4096 pages of 512 bytes
    o.tiers = tiers_;
    MakeStore(o);
  }

  // Computes `prompt` in a cache, releases it, then fills the arena with another
  // namespace's pages so that the LRU evicts every page the prompt left cached.
  void ComputeAndEvict(const std::vector<int32_t>& prompt) {
    auto a = AllocPrompt(ComputeSpec("m"), prompt);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_NO_FATAL_FAILURE(Compute(a->cache_id, prompt, 0));
    for (int l = 0; l < kLayers; ++l) computed_[l] = Kv(a->cache_id, l);
    ASSERT_TRUE(store_->Release("", a->cache_id).ok());
    const std::string filler = Alloc(PrefixSpec("other"));
    const int64_t pages = int64_t(kChunkGranularity / 512) / kLayers;
    for (int l = 0; l < kLayers; ++l) ASSERT_TRUE(AppendRandom(filler, l, pages * kPage).ok());
    ASSERT_TRUE(store_->Release("", filler).ok());
    tiers_->Flush();
    ExpectInvariants();
  }

  // After ComputeAndEvict(prompt) into a host store of its 2 chunks: caches of the
  // `others` specs load none of them, then one of ComputeSpec("m") loads all 16 tokens and
  // holds what the first cache computed, bit for bit.
  void ExpectOnlyTheSameIdentityLoads(const std::vector<int32_t>& prompt,
                                      const std::vector<CacheSpec>& others) {
    for (const CacheSpec& s : others) {
      auto miss = AllocPrompt(s, prompt);
      ASSERT_TRUE(miss.ok()) << miss.status();
      EXPECT_EQ(miss->cached_tokens, 0);
    }
    EXPECT_EQ(store_->Stats().tiers[0].hit_chunks, 0u);
    auto b = AllocPrompt(ComputeSpec("m"), prompt);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->cached_tokens, 16);
    EXPECT_EQ(b->tier_loaded_tokens, 16);
    ASSERT_NO_FATAL_FAILURE(Compute(b->cache_id, prompt, 16));
    for (int l = 0; l < kLayers; ++l) EXPECT_EQ(Kv(b->cache_id, l), computed_[l]) << "layer " << l;
    EXPECT_EQ(store_->Stats().tiers[0].hit_chunks, 2u);
    ExpectInvariants();
  }

  // The spec of namespace ns the test computes in: windows_, kv_format_ and k_scales_.
  CacheSpec ComputeSpec(const std::string& ns) const {
    CacheSpec s = PrefixSpec(ns, windows_);
    s.kv_format = kv_format_;
    s.k_scales = k_scales_;
    return s;
  }

  std::vector<int> windows_;
  KvFormat kv_format_ = KvFormat::kUnspecified;
  std::vector<float> k_scales_;
  std::shared_ptr<TierSet> tiers_;
  std::vector<MapStore*> stores_;
  std::string computed_[kLayers];
};

TEST_F(TierTest, APrefixTheArenaEvictedComesBackFromTheTierBitForBit) {
  const std::vector<int32_t> prompt = Tokens(17);  // 4 full pages, 2 chunks
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(prompt));
  EXPECT_EQ(stores_[0]->size(), 2u);
  auto b = AllocPrompt(PrefixSpec("m"), prompt);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cached_tokens, 16);
  EXPECT_EQ(b->tier_loaded_tokens, 16);
  // The loaded positions hold exactly what the first cache computed.
  ASSERT_NO_FATAL_FAILURE(Compute(b->cache_id, prompt, 16));
  for (int l = 0; l < kLayers; ++l) EXPECT_EQ(Kv(b->cache_id, l), computed_[l]) << "layer " << l;
  const std::vector<TierStats> st = store_->Stats().tiers;
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].medium, "host");
  EXPECT_EQ(st[0].hit_chunks, 2u);
  EXPECT_EQ(st[0].loaded_tokens, 16u);
  EXPECT_EQ(st[0].stored_chunks, 2u);
  ExpectInvariants();
  // A third cache finds the pages the second loaded in the arena: no tier read.
  auto c = AllocPrompt(PrefixSpec("m"), prompt);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cached_tokens, 16);
  EXPECT_EQ(c->tier_loaded_tokens, 0);
  EXPECT_EQ(store_->Stats().tiers[0].lookups, 3u);  // the first cache's miss, then 2 hits
}

// int8 pages (codes and scales) go down and come back unchanged, and only to int8 caches:
// a cache of the same namespace, dtype and geometry in another format misses the chunks.
TEST_F(TierTest, AnInt8PrefixComesBackBitForBitAndOnlyToInt8Caches) {
  // int8 pages of 192 bytes commit in chunks of lcm(192, 2 MiB) = 6 MiB: an arena of one
  // such chunk, which the filler's float32 chunk evicts whole.
  Start(OneStore("host"), kChunkPages, 3 * kChunkGranularity);
  kv_format_ = KvFormat::kInt8;
  const std::vector<int32_t> prompt = Tokens(17);  // 4 full pages, 2 chunks
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(prompt));
  EXPECT_EQ(stores_[0]->size(), 2u);
  ASSERT_NO_FATAL_FAILURE(ExpectOnlyTheSameIdentityLoads(prompt, {PrefixSpec("m")}));
}

// fp8 pages (128 bytes, one 2 MiB arena chunk) come back bit for bit to a cache of the
// same static scales; one whose single K scale differs, or unset scales where the writer
// set them, misses the chunks: their header carries the scales' digest and the hashes too.
TEST_F(TierTest, AnFp8PrefixComesBackOnlyUnderTheSameStaticScales) {
  kv_format_ = KvFormat::kFp8E4M3;
  for (int i = 0; i < kLayers * kHeads; ++i) k_scales_.push_back(0.25f + 0.125f * float(i));
  const std::vector<int32_t> prompt = Tokens(17);  // 4 full pages, 2 chunks
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(prompt));
  EXPECT_EQ(stores_[0]->size(), 2u);
  CacheSpec other = ComputeSpec("m");
  other.k_scales.back() *= 2;
  CacheSpec unset = ComputeSpec("m");
  unset.k_scales.clear();
  ASSERT_NO_FATAL_FAILURE(ExpectOnlyTheSameIdentityLoads(prompt, {other, unset}));
}

TEST_F(TierTest, AnArenaHitIsExtendedByTheTiersPastIt) {
  const std::vector<int32_t> prompt = Tokens(25);  // 6 pages, 3 chunks
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(prompt));
  // A cache that computes only the first chunk again leaves it in the arena.
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 9);
  auto a = AllocPrompt(PrefixSpec("m"), head);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->tier_loaded_tokens, 8);
  auto b = AllocPrompt(PrefixSpec("m"), prompt);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->cached_tokens, 24);
  EXPECT_EQ(b->tier_loaded_tokens, 16);
  ASSERT_NO_FATAL_FAILURE(Compute(b->cache_id, prompt, 24));
  for (int l = 0; l < kLayers; ++l) EXPECT_EQ(Kv(b->cache_id, l), computed_[l]);
  ExpectInvariants();
}

TEST_F(TierTest, ASlidingLayerTakesOnlyWhatItsWindowSees) {
  windows_ = {0, 6};  // layer 1 sees 5 past tokens
  const std::vector<int32_t> prompt = Tokens(17);
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(prompt));
  auto b = AllocPrompt(PrefixSpec("m", windows_), prompt);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cached_tokens, 16);
  EXPECT_EQ(b->tier_loaded_tokens, 16);
  EXPECT_EQ(b->layer_first_pos[1], 8);  // position 16 sees (10, 16]: pages 2 and 3
  ASSERT_NO_FATAL_FAILURE(Compute(b->cache_id, prompt, 16));
  // Attention at the next position equals a recompute's.
  auto r = AllocPrompt(PrefixSpec("fresh", windows_), prompt);
  ASSERT_TRUE(r.ok());
  ASSERT_NO_FATAL_FAILURE(Compute(r->cache_id, prompt, 0));
  for (int l = 0; l < kLayers; ++l)
    EXPECT_EQ(Attend(b->cache_id, l, 16, 1), Attend(r->cache_id, l, 16, 1));
  ExpectInvariants();
}

TEST_F(TierTest, ACorruptOrSwappedChunkIsAMissCountedAndDropped) {
  const std::vector<int32_t> prompt = Tokens(9);  // 2 pages: one chunk
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(prompt));
  const std::vector<int32_t> other = Tokens(9, 500);
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(other));
  ASSERT_EQ(stores_[0]->size(), 2u);
  // Swap the two values: each key now holds the other prefix's chunk.
  std::map<std::string, std::string> v = stores_[0]->Values(), swapped;
  swapped[v.begin()->first] = std::next(v.begin())->second;
  swapped[std::next(v.begin())->first] = v.begin()->second;
  stores_[0]->Replace(swapped);
  auto b = AllocPrompt(PrefixSpec("m"), prompt);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->cached_tokens, 0);
  EXPECT_EQ(store_->Stats().tiers[0].corrupt_chunks, 1u);
  EXPECT_EQ(stores_[0]->size(), 1u);  // dropped from the store
  // Flip one payload byte of the other: its checksum fails.
  stores_[0]->Mutate([](std::string* s) { (*s)[s->size() / 2] ^= 1; });
  auto c = AllocPrompt(PrefixSpec("m"), other);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cached_tokens, 0);
  EXPECT_EQ(store_->Stats().tiers[0].corrupt_chunks, 2u);
  ExpectInvariants();
}

TEST_F(TierTest, AFailingStoreIsAMissNeverAFailedAllocate) {
  const std::vector<int32_t> prompt = Tokens(9);
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(prompt));
  stores_[0]->set_fail(true);
  auto b = AllocPrompt(PrefixSpec("m"), prompt);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cached_tokens, 0);
  EXPECT_EQ(store_->Stats().tiers[0].errors, 1u);
  EXPECT_FALSE(store_->Stats().tiers[0].up);
}

TEST_F(TierTest, AnotherTenantsOrNamespacesChunkNeverHits) {
  const std::vector<int32_t> prompt = Tokens(9);
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(prompt));
  auto b = AllocPrompt(PrefixSpec("n"), prompt);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->cached_tokens, 0);
  auto c = store_->Allocate("", PrefixSpec("m"), "", AllocateOptions{prompt}, "tenant-b");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cached_tokens, 0);
  EXPECT_EQ(store_->Stats().tiers[0].hit_chunks, 0u);
}

// Two nodes sharing a store with different --tier_chunk_pages: the second misses the
// first's chunks and erases none of them (before keys carried P, its chunk 0 of blocks
// 0-3 had the key of the first's chunk 1 of blocks 2-3, read as corrupt and erased).
TEST_F(TierTest, ANodeOfAnotherChunkSizeMissesAndErasesNothing) {
  const std::vector<int32_t> prompt = Tokens(17);  // 4 full pages: two chunks of 2
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(prompt));
  const size_t written = stores_[0]->size();
  ASSERT_GE(written, 2u);
  auto shared = std::make_unique<MapStore>("host");
  shared->CopyFrom(*stores_[0]);
  MapStore* other = shared.get();
  std::vector<TierEntry> v;
  v.push_back(TierEntry{std::move(shared), false});
  Start(std::move(v), /*chunk_pages=*/4);
  auto b = AllocPrompt(PrefixSpec("m"), prompt);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cached_tokens, 0);
  EXPECT_EQ(other->size(), written);
  EXPECT_EQ(store_->Stats().tiers[0].corrupt_chunks, 0u);
}

TEST_F(TierTest, AHostTierThatOverflowsDemotesToTheNextTier) {
  auto host = std::make_unique<MapStore>("host", 3000);  // one chunk of 2 x 2 pages + header
  auto disk = std::make_unique<MapStore>("disk");
  std::vector<TierEntry> stores;
  stores.push_back(TierEntry{std::move(host), false});
  stores.push_back(TierEntry{std::move(disk), false});
  Start(std::move(stores));
  const std::vector<int32_t> first = Tokens(9), second = Tokens(9, 500);
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(first));
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(second));
  EXPECT_EQ(stores_[0]->size(), 1u);
  EXPECT_EQ(stores_[1]->size(), 1u);
  auto b = AllocPrompt(PrefixSpec("m"), first);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->tier_loaded_tokens, 8);
  const std::vector<TierStats> st = store_->Stats().tiers;
  EXPECT_EQ(st[0].hit_chunks, 0u);
  EXPECT_EQ(st[1].hit_chunks, 1u);
  EXPECT_EQ(st[1].loaded_tokens, 8u);
}

TEST_F(TierTest, WriteThroughStoresAChunkOnceItIsFull) {
  Start(OneStore("host", /*write_through=*/true));
  const std::vector<int32_t> prompt = Tokens(9);
  auto a = AllocPrompt(PrefixSpec("m"), prompt);
  ASSERT_TRUE(a.ok());
  ASSERT_NO_FATAL_FAILURE(Compute(a->cache_id, prompt, 0));
  tiers_->Flush();
  EXPECT_EQ(stores_[0]->size(), 1u);  // no eviction needed
  EXPECT_EQ(store_->Stats().tiers[0].stored_chunks, 1u);
  ExpectInvariants();  // its nodes are marked kTierFull, which a write-through pool allows
}

TEST_F(TierTest, EventsSayWhereAPageIsAndNeverThatItIsGoneWhileATierHoldsIt) {
  const std::vector<int32_t> prompt = Tokens(9);
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(prompt));
  bool lost = false;
  std::vector<PrefixEvent> events = store_->PrefixEvents(0, 100000, &lost);
  ASSERT_FALSE(lost);
  // Per (hash, layer): the seq of the arena's removal and of the host tier's store.
  std::map<std::pair<std::string, int>, uint64_t> removed, host_stored;
  for (const PrefixEvent& e : events) {
    const auto key = std::make_pair(e.hash.Hex(), e.layer);
    if (e.kind == PrefixEvent::Kind::kRemoved && e.medium.empty()) removed[key] = e.seq;
    if (e.kind == PrefixEvent::Kind::kStored && e.medium == "host") host_stored[key] = e.seq;
  }
  ASSERT_EQ(host_stored.size(), size_t(2 * kLayers));
  for (const auto& [key, seq] : host_stored) {
    ASSERT_TRUE(removed.contains(key)) << key.first;
    EXPECT_LT(seq, removed[key]) << "layer " << key.second;
  }
}

TEST_F(TierTest, ManyCachesAdoptingOneChunkAtOnceShareOneCopy) {
  const std::vector<int32_t> prompt = Tokens(9);
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(prompt));
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      AllocateOptions o;
      o.prompt_tokens = prompt;
      auto r = store_->Allocate("", PrefixSpec("m"), "", o);
      if (r.ok() && r->cached_tokens == 8) ++ok;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads);
  // One copy of the two pages of each layer, shared by all.
  EXPECT_EQ(store_->Stats().pages.pages_used, 2 * kLayers);
  ExpectInvariants();
}

TEST_F(TierTest, TheAuditCatchesAWriteQueueThatMiscountsItsBytes) {
  ASSERT_NO_FATAL_FAILURE(ComputeAndEvict(Tokens(9)));
  EXPECT_THAT(tiers_->TEST_Audit(), IsOk());
  tiers_->TEST_SkewQueuedBytes(512);
  EXPECT_THAT(store_->TEST_CheckInvariants(),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("tier write queue counts 512 bytes but holds 0")));
  tiers_->TEST_SkewQueuedBytes(-512);
  ExpectInvariants();
}

// A node of the index: a root and one page's node below it, held once each.
class TierFlagsAuditTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = index_.HoldRoot("root", "m", 0, Hash128{1, 2}, 1);
    const int32_t tokens[kPage] = {1, 2, 3, 4};
    node_ = index_.HoldChild(root_, Hash128{3, 4}, tokens, kPage);
    ASSERT_NE(node_, PrefixIndex::kNoNode);
    holds_ = {{root_, 1}, {node_, 1}};
    ASSERT_THAT(index_.TEST_Audit(holds_), IsOk());
  }
  void TearDown() override {
    index_.Unhold(node_);
    index_.Unhold(root_);
  }

  PrefixIndex index_;
  uint64_t root_ = PrefixIndex::kNoNode, node_ = PrefixIndex::kNoNode;
  absl::flat_hash_map<uint64_t, int64_t> holds_;
};

TEST_F(TierFlagsAuditTest, AFlagThePoolsTiersDoNotTakeIsCaught) {
  index_.MarkTiered(node_, Hash128{5, 6}, PrefixIndex::kTierEvicted);
  EXPECT_THAT(index_.TEST_Audit(holds_, PrefixIndex::kTierEvicted), IsOk());
  EXPECT_THAT(index_.TEST_Audit(holds_, PrefixIndex::kTierFull | PrefixIndex::kTierEvicted),
              IsOk());
  EXPECT_THAT(index_.TEST_Audit(holds_, PrefixIndex::kTierFull),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("has tier flags 2 but its pool's tiers take only 1")));
  EXPECT_THAT(index_.TEST_Audit(holds_),  // a pool without tiers
              StatusIs(absl::StatusCode::kInternal, HasSubstr("but its pool's tiers take only 0")));
}

TEST_F(TierFlagsAuditTest, AFlagWithoutAKeyOrOnARootIsCaught) {
  index_.MarkTiered(node_, Hash128{}, PrefixIndex::kTierFull);
  EXPECT_THAT(
      index_.TEST_Audit(holds_, PrefixIndex::kTierFull),
      StatusIs(absl::StatusCode::kInternal, HasSubstr("has tier flags 1 without a tier key")));
  index_.MarkTiered(node_, Hash128{5, 6}, PrefixIndex::kTierFull);
  index_.MarkTiered(root_, Hash128{5, 6}, PrefixIndex::kTierFull);
  EXPECT_THAT(index_.TEST_Audit(holds_, PrefixIndex::kTierFull),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("has tier flags 1 on a root")));
}

}  // namespace
}  // namespace kvarena
