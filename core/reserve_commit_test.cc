// Reserve and Commit, the local path's two calls on KvStore: a reservation is all or
// nothing across caches, and a commit advances lengths only over reserved pages and never
// past max_tokens.
#include <map>

#include "core/prefix_fixture.h"
#include "core/store_fixture.h"

namespace kvarena {
namespace {

using Code = absl::StatusCode;

TEST_F(StoreTest, ReserveIsAllOrNothingAcrossCaches) {
  MakeStore(kChunkGranularity);  // 4096 pages of 512 bytes
  const std::string a = Alloc(Spec(2, 2, 8));
  const std::string b = Alloc(Spec(2, 2, 8, DType::kFloat32, {}, /*max_tokens=*/16));
  auto r = store_->Reserve("", {{a, 6}, {b, 6}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].layers[0].page_ids.size(), 2u);
  EXPECT_EQ(PagesUsed(), 8);
  const Snapshot before = Snap(a);
  EXPECT_THAT(store_->Reserve("", {{a, 100}, {b, 20}}), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(store_->Reserve("", {{a, 100000}, {b, 1}}), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(store_->Reserve("", {{a, 1}, {a, 1}}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(store_->Reserve("", {{a, 1}, {"nope", 1}}), StatusIs(Code::kNotFound));
  EXPECT_TRUE(Snap(a) == before);
  EXPECT_EQ(PagesUsed(), 8);
}

// Two caches' pools both need a chunk the budget lacks and a third pool's cached pages
// can give back only one: the call is refused before either pool took anything, and the
// third pool keeps its cached pages (fuzz/regressions/requests_fuzzer/
// reserve-across-pools-trims-then-refuses: the first pool used to trim them first).
TEST_F(PrefixTest, ReserveAcrossPoolsRefusesBeforeTrimmingOthers) {
  MakeStore(3 * kChunkGranularity);
  const std::vector<int32_t> prompt = Tokens(41);
  auto c = AllocPrompt(PrefixSpec("m"), prompt);
  ASSERT_TRUE(c.ok()) << c.status();
  Compute(c->cache_id, prompt, 0);
  ASSERT_TRUE(store_->Release("", c->cache_id).ok());
  const int64_t cached = store_->Stats().pages.pages_cached;
  ASSERT_GT(cached, 0);
  // Two more geometries (not the prefix's), each filling one chunk to its last page.
  auto ia = store_->Allocate("", Spec(2, 2, 32), "");
  auto ib = store_->Allocate("", Spec(2, 2, 16), "");
  ASSERT_TRUE(ia.ok() && ib.ok());
  const std::string a = ia->cache_id, b = ib->cache_id;
  std::map<std::string, int64_t> tokens;
  for (const CacheInfo& info : {*ia, *ib}) {
    const std::string& id = info.cache_id;
    ASSERT_TRUE(store_->Reserve("", {{id, 4}}).ok());
    tokens[id] = 4;
    const uint64_t pool_id = info.pool_id;
    PoolStats pool;
    for (const PoolStats& p : store_->Stats().pools) {
      if (p.pool_id == pool_id) pool = p;
    }
    const int64_t per_page = pool.pages_used;  // pages one page of tokens takes
    const int64_t in_chunk = int64_t(pool.chunk_bytes / pool.page_bytes);
    tokens[id] += (in_chunk / per_page - 1) * 4;
    ASSERT_TRUE(store_->Reserve("", {{id, tokens[id]}}).ok());
  }
  ArenaStats before = store_->Stats();
  ASSERT_EQ(before.pages.pages_cached, cached);
  EXPECT_THAT(store_->Reserve("", {{a, tokens[a] + 1}, {b, tokens[b] + 1}}),
              StatusIs(Code::kResourceExhausted));
  ArenaStats after = store_->Stats();
  EXPECT_EQ(after.pages.pages_cached, cached);
  EXPECT_EQ(after.pages.pages_used, before.pages.pages_used);
  // One of them alone fits, taking the third pool's cached chunk.
  EXPECT_TRUE(store_->Reserve("", {{a, tokens[a] + 1}}).ok());
  ExpectInvariants();
}

TEST_F(StoreTest, CommitAdvancesLengthsOverWrittenPages) {
  const std::string a = Alloc(Spec(2, 2, 8, DType::kFloat32, {0, 3}));
  EXPECT_THAT(store_->Commit("", {{a, 1}}), StatusIs(Code::kFailedPrecondition));
  ASSERT_TRUE(store_->Reserve("", {{a, 8}}).ok());
  auto c = store_->Commit("", {{a, 5}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0].seq_len, 5);
  EXPECT_EQ((*c)[0].layer_lens, (std::vector<int64_t>{5, 5}));
  ASSERT_TRUE(store_->Commit("", {{a, 3}}).ok());
  EXPECT_THAT(store_->Commit("", {{a, 1}}), StatusIs(Code::kFailedPrecondition));
  // Sliding layer 1 (w=3): after the block starting at 5, keys below 3 are dead.
  EXPECT_EQ(store_->Describe("", a)->layers[1].first_pos, 0);
  ASSERT_TRUE(store_->Reserve("", {{a, 4}}).ok());
  ASSERT_TRUE(store_->Commit("", {{a, 4}}).ok());
  EXPECT_EQ(store_->Describe("", a)->layers[1].first_pos, 4);
}

TEST_F(StoreTest, CommitStopsAtMaxTokensEvenInsideReservedPages) {
  const std::string a = Alloc(Spec(1, 2, 8, DType::kFloat32, {}, /*max_tokens=*/6));
  ASSERT_TRUE(store_->Reserve("", {{a, 6}}).ok());  // two pages of 4: room for 8
  EXPECT_THAT(store_->Commit("", {{a, 7}}), StatusIs(Code::kResourceExhausted));
  EXPECT_EQ(store_->Describe("", a)->info.seq_len, 0);
  EXPECT_TRUE(store_->Commit("", {{a, 6}}).ok());
}

}  // namespace
}  // namespace kvarena
