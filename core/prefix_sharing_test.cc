// Prefix reuse once pages are shared: popn's copy on write, Fork, Reserve's private pages,
// the quota's charge for adopted pages, and the events the pools record (the fixture:
// prefix_fixture.h).
#include "core/prefix_fixture.h"
#include "core/prefix_hash.h"

namespace kvarena {
namespace {

TEST_F(PrefixTest, PopnIntoASharedPageCopiesWhatItKeeps) {
  const std::vector<int32_t> prompt = Tokens(10);
  std::string a, b;
  ASSERT_NO_FATAL_FAILURE(ComputeThenAdopt(prompt, &a, &b));
  const std::string a_before = Kv(a, 0) + Kv(a, 1);
  auto r = store_->Popn("", b, 2);  // cuts into the second shared page
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->popped, 2);
  EXPECT_EQ(store_->Stats().pages.cow_copies, uint64_t(kLayers));
  EXPECT_EQ(store_->Describe("", b)->info.cached_tokens, 6);
  ExpectInvariants();
  // b rewrites positions 6.. with other tokens; a keeps its own.
  std::vector<int32_t> other(prompt.begin(), prompt.begin() + 6);
  other.insert(other.end(), {55, 56, 57});
  Compute(b, other, 6);
  EXPECT_EQ(Kv(a, 0) + Kv(a, 1), a_before);
  for (int l = 0; l < kLayers; ++l) EXPECT_EQ(Kv(b, l), Expected(other, l, 0, 9));
  EXPECT_EQ(store_->Stats().pages.pages_shared, kLayers);  // the first page still is
  ExpectInvariants();
}

TEST_F(PrefixTest, ForkSharesFullPagesAndCopiesThePartialOne) {
  const std::vector<int32_t> prompt = Tokens(10);
  auto a = AllocPrompt(PrefixSpec("m"), prompt);
  Compute(a->cache_id, prompt, 0);
  const int64_t before = PagesUsed();
  auto f = store_->Fork("", a->cache_id, "fork");
  ASSERT_TRUE(f.ok()) << f.status();
  specs_["fork"] = f->spec;
  EXPECT_EQ(f->seq_len, 10);
  EXPECT_EQ(f->cached_tokens, 10);
  EXPECT_EQ(f->tokens_known, 10);
  EXPECT_EQ(PagesUsed(), before + kLayers);  // one copied page per layer
  EXPECT_EQ(store_->Stats().pages.forks, 1u);
  EXPECT_EQ(store_->Stats().pages.pages_shared, 2 * kLayers);
  ExpectInvariants();
  for (int l = 0; l < kLayers; ++l) EXPECT_EQ(Kv("fork", l), Kv(a->cache_id, l));
  // Divergent continuations leave each other untouched.
  std::vector<int32_t> ta = prompt, tf = prompt;
  ta.insert(ta.end(), {1, 2, 3});
  tf.insert(tf.end(), {4, 5, 6, 7, 8});
  Compute(a->cache_id, ta, 10);
  Compute("fork", tf, 10);
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(Kv(a->cache_id, l), Expected(ta, l, 0, 13));
    EXPECT_EQ(Kv("fork", l), Expected(tf, l, 0, 15));
  }
  // A popn in the fork back into shared pages copies; the source keeps its K/V.
  ASSERT_EQ(store_->Popn("", "fork", 9)->popped, 9);
  EXPECT_EQ(store_->Stats().pages.cow_copies, uint64_t(kLayers));
  for (int l = 0; l < kLayers; ++l) EXPECT_EQ(Kv(a->cache_id, l), Expected(ta, l, 0, 13));
  ExpectInvariants();
  ASSERT_TRUE(store_->Release("", a->cache_id).ok());
  ExpectInvariants();
  ASSERT_TRUE(store_->Release("", "fork").ok());
  ExpectInvariants();
  EXPECT_EQ(PagesUsed(), 0);
}

TEST_F(PrefixTest, ForkRefusalsChangeNothing) {
  StoreOptions o = Options(size_t{64} << 20);
  o.session_max_pages = 10;
  MakeStore(o);
  auto session = store_->OpenSession("t");
  ASSERT_TRUE(session.ok());
  AllocateOptions prompt{Tokens(18)};
  auto a = store_->Allocate(*session, PrefixSpec("m"), "a", prompt);
  ASSERT_TRUE(a.ok());
  for (int l = 0; l < kLayers; ++l) {
    OwnedTensor k = ModelKv(prompt.prompt_tokens, l, 0, 0, 18);
    ASSERT_TRUE(store_->Append(*session, "a", l, 0, k.Arg(), k.Arg()).ok());
  }
  const std::string before = store_->TEST_DebugState();
  EXPECT_THAT(store_->Fork(*session, "a", "b"),
              StatusIs(absl::StatusCode::kResourceExhausted));  // 10 pages more
  EXPECT_THAT(store_->Fork(*session, "a", "a"), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(store_->Fork(*session, "zz", "b"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->Fork("", "a", "b"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(store_->Fork(*session, "a", std::string(300, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(store_->TEST_DebugState(), before);
  ExpectInvariants();
}

TEST_F(PrefixTest, ReserveHandsOutOnlyPrivatePages) {
  const std::vector<int32_t> prompt = Tokens(9);
  std::string a, b;
  ASSERT_NO_FATAL_FAILURE(ComputeThenAdopt(prompt, &a, &b));
  auto shared = store_->Describe("", b);
  auto r = store_->Reserve("", {CacheTokens{b, 5}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].first_pos, 8);
  for (int l = 0; l < kLayers; ++l) {
    for (int32_t id : (*r)[0].layers[size_t(l)].page_ids) {
      for (const LayerPages& lp : shared->layers) {
        EXPECT_EQ(std::count(lp.page_ids.begin(), lp.page_ids.end(), id), 0) << "page " << id;
      }
    }
  }
  ASSERT_TRUE(store_->Commit("", {CacheTokens{b, 5}}).ok());
  ExpectInvariants();  // audits that every page b may write is private
}

TEST_F(PrefixTest, AdoptionChargesTheQuotaOrAdoptsNothing) {
  StoreOptions o = Options(size_t{64} << 20);
  o.session_max_pages = 7;
  MakeStore(o);
  const std::vector<int32_t> prompt = Tokens(9);
  auto a = AllocPrompt(PrefixSpec("m"), prompt);  // sessionless: a quota of its own
  Compute(a->cache_id, prompt, 0);
  auto session = store_->OpenSession("t");
  auto other = store_->Allocate(*session, PrefixSpec(""), "held");
  ASSERT_TRUE(other.ok());
  OwnedTensor k = RandomTensor(rng_, DType::kFloat32, kHeads, 4 * kPage, kDim);
  ASSERT_TRUE(store_->Append(*session, "held", 0, 0, k.Arg(), k.Arg()).ok());  // 4 of 7 pages
  auto b = store_->Allocate(*session, PrefixSpec("m"), "", AllocateOptions{prompt});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->cached_tokens, 0);  // its 4 pages would pass session_max_pages=7
  ASSERT_TRUE(store_->Release(*session, "held").ok());
  auto c = store_->Allocate(*session, PrefixSpec("m"), "", AllocateOptions{prompt});
  EXPECT_EQ(c->cached_tokens, 8);
  ExpectInvariants();
}

TEST_F(PrefixTest, EventsRecordStoredRemovedAndClearedInOrder) {
  StoreOptions o = Options(kChunkGranularity);  // one chunk of 4096 pages
  o.max_pools = 1;
  o.prefix_event_capacity = 5;
  MakeStore(o);
  const std::vector<int32_t> prompt = Tokens(10);
  auto a = AllocPrompt(PrefixSpec("m"), prompt);
  Compute(a->cache_id, prompt, 0);
  bool lost = true;
  std::vector<PrefixEvent> ev = store_->PrefixEvents(0, 100, &lost);
  EXPECT_FALSE(lost);
  ASSERT_EQ(ev.size(), 4u);  // two full pages on each of two layers, layer by layer
  CacheSpec resolved = PrefixSpec("m");
  const Hash128 root = PrefixRootHash("m", resolved);
  const Hash128 first = PrefixPageHash(root, prompt.data(), kPage);
  const Hash128 second = PrefixPageHash(first, prompt.data() + kPage, kPage);
  for (size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i].seq, i + 1);
    EXPECT_EQ(ev[i].kind, PrefixEvent::Kind::kStored);
    EXPECT_EQ(ev[i].layer, int(i / 2));
    EXPECT_EQ(ev[i].hash, i % 2 == 0 ? first : second);
    EXPECT_EQ(ev[i].parent_hash, i % 2 == 0 ? root : first);
    EXPECT_EQ(ev[i].token_ids, std::vector<int32_t>(prompt.begin() + int(i % 2) * kPage,
                                                    prompt.begin() + int(i % 2 + 1) * kPage));
  }
  ASSERT_TRUE(store_->Release("", a->cache_id).ok());
  EXPECT_EQ(store_->NextPrefixEventSeq(), 5u);  // parking is no event: the hashes still hit
  // Fill the arena: the pool reclaims one cached page (the tail's), which stops hitting.
  auto big = AllocPrompt(PrefixSpec(""), {});
  OwnedTensor k = RandomTensor(rng_, DType::kFloat32, kHeads,
                               (store_->Stats().pools[0].num_pages - 3) * kPage, kDim);
  ASSERT_TRUE(store_->Append("", big->cache_id, 0, 0, k.Arg(), k.Arg()).ok());
  ev = store_->PrefixEvents(5, 100, &lost);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, PrefixEvent::Kind::kRemoved);
  EXPECT_EQ(ev[0].hash, second);
  ASSERT_TRUE(store_->Release("", big->cache_id).ok());
  // A new geometry displaces the idle pool and its cached pages: AllCleared.
  ASSERT_TRUE(store_->Allocate("", Spec(1, 1, 8), "").ok());
  ev = store_->PrefixEvents(6, 100, &lost);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, PrefixEvent::Kind::kAllCleared);
  EXPECT_EQ(ev[0].pool_id, 0u);
  // Only the last 5 are kept: a reader from 1 learns that events were lost.
  ev = store_->PrefixEvents(1, 100, &lost);
  EXPECT_TRUE(lost);
  EXPECT_EQ(ev.front().seq, 2u);
  EXPECT_EQ(ev.back().seq, 6u);
  // A seq past the newest (another incarnation's) is lost too, and replays what is kept.
  ev = store_->PrefixEvents(store_->NextPrefixEventSeq() + 1, 100, &lost);
  EXPECT_TRUE(lost);
  ASSERT_EQ(ev.size(), 5u);
  EXPECT_EQ(ev.front().seq, 2u);
  ev = store_->PrefixEvents(store_->NextPrefixEventSeq(), 100, &lost);  // up to date
  EXPECT_FALSE(lost);
  EXPECT_TRUE(ev.empty());
}

}  // namespace
}  // namespace kvarena
