// The metadata budget (--metadata_bytes): what requests make the store hold besides the
// arena — a cache's per-layer tables, declared token ids and their page hashes, prefix-index
// nodes — is charged while it lives and given back when it goes; a request past the
// budget is refused up front (RESOURCE_EXHAUSTED tagged metadata_bytes) and changes
// nothing. The event log is bounded in bytes as well as in events.
#include <vector>

#include "core/prefix_index.h"
#include "core/refusal.h"
#include "core/store_fixture.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;
using Code = absl::StatusCode;

constexpr size_t kBudget = size_t{4} << 20;

std::vector<int32_t> Tokens(int64_t n, int32_t first = 1) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = first + int32_t(i % 50000);
  return t;
}

CacheSpec Shared(int layers, int page_size, const std::string& ns = "x") {
  CacheSpec s = Spec(layers, 1, 4, DType::kFloat32, {}, 0, page_size);
  s.prefix_namespace = ns;
  return s;
}

class MetadataTest : public StoreTest {
 protected:
  void SetUp() override {
    StoreOptions o = Options(size_t{64} << 20);
    o.metadata_bytes = kBudget;
    MakeStore(o);
  }
  absl::StatusOr<CacheInfo> AllocPrompt(const CacheSpec& spec, int64_t tokens,
                                        const std::string& id = "") {
    AllocateOptions o;
    o.prompt_tokens = Tokens(tokens);
    return store_->Allocate("", spec, id, o);
  }
  size_t Used() { return store_->Stats().metadata_bytes_used; }
  static void ExpectMetadataRefusal(const absl::Status& s, const std::string& op) {
    EXPECT_THAT(s, StatusIs(Code::kResourceExhausted));
    EXPECT_THAT(std::string(s.message()), HasSubstr(op + ": "));
    EXPECT_THAT(std::string(s.message()), HasSubstr("metadata_bytes=4194304"));
    EXPECT_STREQ(RefusalName(RefusalOf(s)), "metadata_bytes");
  }
};

TEST_F(MetadataTest, StatsReportTheBudgetAndEveryCacheIsCharged) {
  EXPECT_EQ(store_->Stats().metadata_bytes, kBudget);
  EXPECT_EQ(Used(), 0u);
  const std::string a = Alloc(Spec(8, 1, 4));
  const size_t one = Used();
  EXPECT_GE(one, 8 * sizeof(int64_t));
  Alloc(Spec(8, 1, 4));
  EXPECT_EQ(Used(), 2 * one);
  ASSERT_TRUE(store_->Release("", a).ok());
  EXPECT_EQ(Used(), one);
}

// An empty 1024-layer cache once cost 63.6 KB uncharged, 1 GB at --max_caches.
TEST_F(MetadataTest, EmptyManyLayerCachesStopAtTheBudget) {
  int made = 0;
  absl::Status refused;
  for (; made < 10000; ++made) {
    auto info = store_->Allocate("", Spec(1024, 1, 4), "");
    if (!info.ok()) {
      refused = info.status();
      break;
    }
  }
  ExpectMetadataRefusal(refused, "allocate");
  EXPECT_THAT(std::string(refused.message()), HasSubstr("a cache of 1024 layers"));
  EXPECT_GT(made, 0);
  EXPECT_LE(size_t(made) * 1024 * 32, kBudget);  // each is charged at least its tables
  EXPECT_LE(Used(), kBudget);
  EXPECT_EQ(store_->Stats().num_caches, made);
}

// The finding: a 2^20-token prompt at page_size 1 with a namespace grew the daemon by
// 4.7 GB. Now it is refused before anything is hashed or indexed.
TEST_F(MetadataTest, APromptPastTheBudgetIsRefusedUpFrontAndChangesNothing) {
  const std::string before = store_->TEST_DebugState();
  auto info = AllocPrompt(Shared(1024, 1), int64_t{1} << 20, "big");
  ExpectMetadataRefusal(info.status(), "allocate");
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("1048576 token ids"));
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("prefix-index nodes"));
  EXPECT_EQ(store_->TEST_DebugState(), before);
  EXPECT_EQ(Used(), 0u);
  EXPECT_EQ(store_->Stats().num_caches, 0);
  EXPECT_THAT(store_->Describe("", "big"), StatusIs(Code::kNotFound));
  // The id is free again, and a prompt within the budget is taken.
  EXPECT_TRUE(AllocPrompt(Shared(2, 4), 1000, "big").ok());
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();
}

TEST_F(MetadataTest, IndexNodesAreChargedWhileTheyLive) {
  auto plain = AllocPrompt(Spec(4, 1, 4, DType::kFloat32, {}, 0, 4), 4000);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const size_t without_nodes = Used();
  ASSERT_TRUE(store_->Release("", plain->cache_id).ok());
  auto shared = AllocPrompt(Shared(4, 4), 4000);
  ASSERT_TRUE(shared.ok()) << shared.status();
  // 1000 full pages: each a node of the index, besides the cache's own link to it.
  EXPECT_GE(Used(), without_nodes + 1000 * (4 * sizeof(int32_t) + 4 * sizeof(int32_t)));
  ASSERT_TRUE(store_->Release("", shared->cache_id).ok());
  EXPECT_EQ(Used(), 0u);  // no page was written, so no node outlives the cache
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();
}

TEST_F(MetadataTest, SetTokensPastTheBudgetIsRefusedAndChangesNothing) {
  const std::string id = Alloc(Spec(2, 1, 4));
  SetTokensArgs ok{id, 0, Tokens(1000)};
  ASSERT_TRUE(store_->SetTokens("", ok).ok());
  const size_t used = Used();
  const std::string before = store_->TEST_DebugState();
  SetTokensArgs big{id, 1000, Tokens(int64_t{1} << 20)};
  ExpectMetadataRefusal(store_->SetTokens("", big).status(), "set_tokens");
  EXPECT_EQ(store_->Describe("", id)->info.tokens_known, 1000);
  EXPECT_EQ(Used(), used);
  EXPECT_EQ(store_->TEST_DebugState(), before);
  // Declaring fewer gives bytes back.
  SetTokensArgs shorter{id, 0, Tokens(10)};
  ASSERT_TRUE(store_->SetTokens("", shorter).ok());
  EXPECT_LT(Used(), used);
}

// The finding: 100 forks of a 2^20-token cache took 2.4 GB in 1.2 s.
TEST_F(MetadataTest, ForksChargeTheTokensTheyCopyUntilTheBudgetRefuses) {
  auto src = AllocPrompt(Spec(2, 1, 4, DType::kFloat32, {}, 0, 16), 100000);
  ASSERT_TRUE(src.ok()) << src.status();
  const size_t one = Used();
  std::vector<std::string> forks;
  absl::Status refused;
  for (int i = 0; i < 100; ++i) {
    auto f = store_->Fork("", src->cache_id, "");
    if (!f.ok()) {
      refused = f.status();
      break;
    }
    forks.push_back(f->cache_id);
  }
  ExpectMetadataRefusal(refused, "fork");
  EXPECT_EQ(forks.size(), kBudget / one - 1);  // each fork costs what its source does
  EXPECT_LE(Used(), kBudget);
  EXPECT_EQ(store_->Stats().num_caches, int64_t(forks.size()) + 1);
  for (const std::string& f : forks) ASSERT_TRUE(store_->Release("", f).ok());
  EXPECT_EQ(Used(), one);
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();
}

TEST_F(MetadataTest, APromptWhoseIndexNodesDoNotFitIsRefused) {
  // The first prompt's 3000 index nodes take most of the budget; the second, as long,
  // would need as many again and is refused before it indexes anything.
  auto a = AllocPrompt(Shared(64, 4, "a"), 12000);
  ASSERT_TRUE(a.ok()) << a.status();
  const size_t used = Used();
  EXPECT_GE(used, 3000 * PrefixIndex::NodeBytes(64, 4));
  EXPECT_LE(used, kBudget);
  ExpectMetadataRefusal(AllocPrompt(Shared(64, 4, "b"), 12000).status(), "allocate");
  EXPECT_EQ(Used(), used);
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok()) << store_->TEST_CheckInvariants();
  ASSERT_TRUE(store_->Release("", a->cache_id).ok());
  EXPECT_EQ(Used(), 0u);
}

TEST_F(MetadataTest, ASessionsShareStopsItButNotTheOthers) {
  StoreOptions o = Options(size_t{64} << 20);
  o.metadata_bytes = kBudget;
  o.session_metadata_bytes = kBudget / 4;
  MakeStore(o);
  auto hog = store_->OpenSession("hog");
  auto other = store_->OpenSession("other");
  ASSERT_TRUE(hog.ok() && other.ok());
  AllocateOptions prompt;
  prompt.prompt_tokens = Tokens(20000);  // about 240 KB of ids and hashes at page_size 4
  absl::Status refused;
  int made = 0;
  for (; made < 100; ++made) {
    auto info = store_->Allocate(*hog, Spec(2, 1, 4), "", prompt);
    if (!info.ok()) {
      refused = info.status();
      break;
    }
  }
  EXPECT_THAT(refused, StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("session_metadata_bytes=1048576"));
  EXPECT_STREQ(RefusalName(RefusalOf(refused)), "metadata_bytes");
  EXPECT_EQ(made, 4);
  EXPECT_LE(Used(), kBudget / 4);
  // Another session, and the sessionless caches, still have the rest of the daemon's.
  EXPECT_TRUE(store_->Allocate(*other, Spec(2, 1, 4), "", prompt).ok());
  EXPECT_TRUE(store_->Allocate("", Spec(2, 1, 4), "", prompt).ok());
}

TEST(PrefixEventLogTest, KeepsAtMostItsBytesAndReportsWhatWasLost) {
  PrefixEventLog log(/*capacity=*/1000, /*max_bytes=*/10000);
  PrefixEvent e;
  e.token_ids.assign(100, 7);  // about 400 bytes each with the struct
  const size_t each = PrefixEventLog::Bytes(e);
  for (int i = 0; i < 100; ++i) log.Append(e);
  EXPECT_LE(log.bytes(), size_t{10000});
  EXPECT_EQ(log.bytes(), (10000 / each) * each);
  bool lost = false;
  const std::vector<PrefixEvent> kept = log.ReadFrom(1, 1000, &lost);
  EXPECT_TRUE(lost);
  EXPECT_EQ(kept.size(), 10000 / each);
  EXPECT_EQ(kept.back().seq, 100u);
  // One event larger than the whole bound is still kept, alone.
  e.token_ids.assign(10000, 7);
  log.Append(e);
  EXPECT_EQ(log.ReadFrom(0, 1000, &lost).size(), 1u);
}

}  // namespace
}  // namespace kvarena
