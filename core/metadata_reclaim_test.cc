// Metadata that no caller can pin for the others: prefixes no cache holds any more (their
// index nodes, kept for reuse) keep at most StoreOptions::cached_metadata_bytes of the
// budget, and give it back, least recently cached first, before a metadata charge is
// refused; each owner (tenant) holds at most its share of the budget.
#include <string>
#include <vector>

#include "core/prefix_index.h"
#include "core/refusal.h"
#include "core/store_fixture.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;
using Code = absl::StatusCode;

constexpr size_t kBudget = size_t{4} << 20;
constexpr int64_t kRoundTokens = 2000;
constexpr int64_t kWholeHit = kRoundTokens - 1;  // all but the prompt's last token

// A one-layer cache of page size 1 in namespace ns: one index node per token, the most
// metadata a token can cost (the red team's shape; pages of 512 bytes, so a chunk's page
// bookkeeping is a small part of the budget).
CacheSpec OneLayer(const std::string& ns, int head_dim = 64) {
  CacheSpec s = Spec(1, 1, head_dim, DType::kFloat32, {}, 0, /*page_size=*/1);
  s.prefix_namespace = ns;
  return s;
}

std::vector<int32_t> Prompt(int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t(i % 30000) + 1;
  return t;
}

class MetadataReclaimTest : public StoreTest {
 protected:
  void SetUp() override { MakeStore(Budgeted(/*cached=*/0)); }
  StoreOptions Budgeted(size_t cached_metadata_bytes) {
    StoreOptions o = Options(size_t{64} << 20);
    o.metadata_bytes = kBudget;
    o.cached_metadata_bytes = cached_metadata_bytes;
    return o;
  }
  // One round of the red team's: a sessionless caller allocates with a prompt in a fresh
  // namespace, appends the prompt's K/V (its pages become cached prefix pages) and releases.
  // The K/V of what it did not find cached.
  absl::Status Round(const std::string& ns, int head_dim = 64) {
    AllocateOptions o;
    o.prompt_tokens = Prompt(kRoundTokens);
    auto info = store_->Allocate("", OneLayer(ns, head_dim), "", o);
    if (!info.ok()) return info.status();
    const int64_t n = kRoundTokens - info->cached_tokens;
    OwnedTensor k = RandomTensor(rng_, DType::kFloat32, 1, n, head_dim);
    auto appended = store_->Append("", info->cache_id, 0, info->cached_tokens, k.Arg(), k.Arg());
    if (!appended.ok()) return appended.status();
    return store_->Release("", info->cache_id);
  }
  // The prompt tokens a new cache of ns finds cached (it is released again): at most all
  // but the last, which a model computes again for its logits.
  int64_t CachedTokens(const std::string& ns, int head_dim = 64) {
    AllocateOptions o;
    o.prompt_tokens = Prompt(kRoundTokens);
    auto info = store_->Allocate("", OneLayer(ns, head_dim), "", o);
    EXPECT_TRUE(info.ok()) << info.status();
    if (!info.ok()) return -1;
    EXPECT_TRUE(store_->Release("", info->cache_id).ok());
    return info->cached_tokens;
  }
  ArenaStats Stats() { return store_->Stats(); }
};

// The finding: 24 such rounds left every metadata byte to cached prefixes, and every
// Allocate from anyone was refused until a restart.
TEST_F(MetadataReclaimTest, TheRedTeamsRoundsLeaveAFreshCallerServed) {
  const size_t node = PrefixIndex::NodeBytes(1, 1);
  ASSERT_GT(24 * kRoundTokens * node, kBudget) << "the rounds must outgrow the budget";
  for (int r = 0; r < 24; ++r) {
    ASSERT_TRUE(Round("round-" + std::to_string(r)).ok()) << "round " << r;
    const ArenaStats st = Stats();
    EXPECT_LE(st.cached_metadata_bytes, st.cached_metadata_limit) << "round " << r;
    EXPECT_LE(st.metadata_bytes_used, kBudget);
  }
  const ArenaStats st = Stats();
  EXPECT_EQ(st.num_caches, 0);
  EXPECT_EQ(st.cached_metadata_limit, kBudget / 2);  // the default share
  EXPECT_GT(st.pages.pages_cached, 0);               // reuse is kept, within its share
  EXPECT_GT(st.pages.pages_reclaimed_for_metadata, 0u);
  // A fresh caller's cache of 32 layers, and the most recent prefix still hits whole.
  EXPECT_TRUE(store_->Allocate("", Spec(32, 8, 128), "fresh").ok());
  EXPECT_EQ(CachedTokens("round-23"), kWholeHit);
  EXPECT_EQ(CachedTokens("round-0"), 0);
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();
}

// With a share as large as the budget, cached prefixes fill it, and a charge that finds
// it full takes it back from the least recently cached before it refuses anything.
TEST_F(MetadataReclaimTest, AFullBudgetIsTakenBackFromTheOldestCachedPrefixes) {
  MakeStore(Budgeted(/*cached=*/kBudget));
  for (int r = 0; r < 12; ++r) ASSERT_TRUE(Round("round-" + std::to_string(r)).ok()) << r;
  const ArenaStats full = Stats();
  EXPECT_GT(full.cached_metadata_bytes, kBudget / 2);  // past what the default would keep
  EXPECT_GT(full.pages.pages_reclaimed_for_metadata, 0u);
  const uint64_t reclaimed = full.pages.pages_reclaimed_for_metadata;
  EXPECT_EQ(CachedTokens("round-11"), kWholeHit);  // the newest outlives the oldest
  EXPECT_EQ(CachedTokens("round-0"), 0);
  // 512 caches of 32 layers need what the cached prefixes hold: served, by reclaiming.
  for (int i = 0; i < 512; ++i) {
    ASSERT_TRUE(store_->Allocate("", Spec(32, 8, 128), "c" + std::to_string(i)).ok()) << i;
  }
  EXPECT_GT(Stats().pages.pages_reclaimed_for_metadata, reclaimed);
  EXPECT_LT(Stats().cached_metadata_bytes, full.cached_metadata_bytes);
  EXPECT_EQ(Stats().num_caches, 512);
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();
}

// When nothing cached is left to give, the refusal is as before: the budget, named.
TEST_F(MetadataReclaimTest, LiveCachesAreNeverReclaimedAndTheRefusalNamesTheBudget) {
  absl::Status refused;
  int made = 0;
  for (; made < 1000; ++made) {
    auto info = store_->Allocate("", Spec(1024, 1, 4), "");
    if (!info.ok()) {
      refused = info.status();
      break;
    }
  }
  EXPECT_THAT(refused, StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("metadata_bytes=4194304"));
  EXPECT_EQ(Stats().num_caches, made);
  EXPECT_EQ(Stats().pages.pages_reclaimed_for_metadata, 0u);
}

// The arena's pools are one LRU order: the prefix cached first goes first, whichever pool.
TEST_F(MetadataReclaimTest, TheOldestCachedPrefixGoesFirstAcrossPools) {
  // Room for about one round's nodes: the second round's release pushes out the first.
  MakeStore(Budgeted(/*cached=*/kRoundTokens * PrefixIndex::NodeBytes(1, 1) * 3 / 2));
  ASSERT_TRUE(Round("a", /*head_dim=*/64).ok());
  ASSERT_TRUE(Round("b", /*head_dim=*/32).ok());  // another geometry: another pool
  EXPECT_EQ(Stats().pools.size(), 2u);
  EXPECT_EQ(CachedTokens("b", 32), kWholeHit);
  EXPECT_LT(CachedTokens("a", 64), kRoundTokens / 2);
  // And the other way round: b is now older than a new round of a.
  ASSERT_TRUE(Round("a", 64).ok());
  EXPECT_EQ(CachedTokens("a", 64), kWholeHit);
  EXPECT_LT(CachedTokens("b", 32), kRoundTokens / 2);
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();
}

class OwnerMetadataTest : public StoreTest {
 protected:
  void MakeOwners(size_t a_max_metadata) {
    StoreOptions o = Options(size_t{64} << 20);
    o.metadata_bytes = kBudget;
    o.owners["a"] = OwnerBounds{/*max_caches=*/4, /*max_pages=*/8, a_max_metadata};
    o.owners["b"] = OwnerBounds{};
    MakeStore(o);
  }
  // The red team's tenant shape: its max_caches of 1024 layers at page size 1, each
  // declaring ids 5,000 at a time until a refusal. Returns the last refusal.
  absl::Status FillAsA() {
    absl::Status last;
    for (int c = 0; c < 4; ++c) {
      const std::string id = "a" + std::to_string(c);
      auto info = store_->Allocate("", Spec(1024, 1, 4, DType::kFloat32, {}, 0, 1), id, {}, "a");
      if (!info.ok()) return info.status();
      for (int64_t pos = 0;; pos += 5000) {
        SetTokensArgs args{id, pos, Prompt(5000)};
        if (auto s = store_->SetTokens("", args); !s.ok()) {
          last = s.status();
          break;
        }
      }
    }
    return last;
  }
};

TEST_F(OwnerMetadataTest, AnOwnerWithoutABoundGetsAnEqualShare) {
  MakeOwners(0);
  const absl::Status refused = FillAsA();
  EXPECT_THAT(refused, StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("tenant 'a' max_metadata_bytes=" + std::to_string(kBudget / 2)));
  EXPECT_STREQ(RefusalName(RefusalOf(refused)), "metadata_bytes");
  EXPECT_LE(store_->Stats().metadata_bytes_used, kBudget / 2);
  // b is served: a cache of the same shape declaring the red team's 55,000 ids.
  EXPECT_TRUE(
      store_->Allocate("", Spec(1024, 1, 4, DType::kFloat32, {}, 0, 1), "b0", {}, "b").ok());
  SetTokensArgs args{"b0", 0, Prompt(55000)};
  EXPECT_TRUE(store_->SetTokens("", args).ok());
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();
}

TEST_F(OwnerMetadataTest, AnOwnersStatedBoundIsItsShare) {
  MakeOwners(size_t{64} << 10);
  const absl::Status refused = FillAsA();
  EXPECT_THAT(refused, StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("tenant 'a' max_metadata_bytes=65536"));
  EXPECT_LE(store_->Stats().metadata_bytes_used, size_t{64} << 10);
  EXPECT_TRUE(store_->Allocate("", Spec(1024, 1, 4), "b0", {}, "b").ok());
}

// A session of an owner draws from the owner's share: its caches and the owner's
// sessionless ones count together.
TEST_F(OwnerMetadataTest, AnOwnersSessionsDrawFromItsShare) {
  MakeOwners(size_t{64} << 10);  // one empty 1024-layer cache, not two
  SessionPeer peer;
  peer.owner = "a";
  const std::string session = store_->AttachSession("w", "", peer)->session_id;
  int made = 0;
  absl::Status refused;
  for (; made < 100; ++made) {
    auto info = store_->Allocate(made % 2 == 0 ? session : "", Spec(1024, 1, 4), "", {}, "a");
    if (!info.ok()) {
      refused = info.status();
      break;
    }
  }
  EXPECT_THAT(std::string(refused.message()), HasSubstr("tenant 'a' max_metadata_bytes=65536"));
  EXPECT_EQ(made, 1);  // the session's cache leaves no room for a sessionless one
  EXPECT_TRUE(store_->Allocate("", Spec(1024, 1, 4), "", {}, "b").ok());
}

}  // namespace
}  // namespace kvarena
