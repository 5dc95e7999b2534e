// Bounded resources and lifetimes: every bound refuses with RESOURCE_EXHAUSTED, a
// message naming it and the bound's tag (core/refusal.h: what the metrics count), and
// gives everything back when the caches or sessions go; pages a cache is handed never
// show another cache's bytes; the reaper releases only what an expired session still
// owns; expiry runs on the fake clock, without sleeping.
#include <set>

#include "core/refusal.h"
#include "core/store_fixture.h"
#include "core/validate.h"

namespace kvarena {
namespace {

using ::testing::HasSubstr;
using Code = absl::StatusCode;

class BoundsTest : public StoreTest {
 protected:
  template <typename T>
  static void ExpectExhausted(const T& result, Refusal reason, const std::string& message) {
    EXPECT_THAT(result, StatusIs(Code::kResourceExhausted));
    EXPECT_THAT(std::string(testing::GetStatus(result).message()), HasSubstr(message));
    EXPECT_STREQ(RefusalName(RefusalOf(testing::GetStatus(result))), RefusalName(reason));
  }
  absl::Status AppendTo(const std::string& session, const std::string& id, int64_t pos, int64_t n) {
    OwnedTensor k = RandomTensor(rng_, DType::kFloat32, 2, n, 8);
    return store_->Append(session, id, 0, pos, k.Arg(), k.Arg()).status();
  }
};

// Nine released one-token caches of different geometries once kept a chunk each.
TEST_F(BoundsTest, APoolGoesWithItsLastCacheAndGivesItsMemoryBack) {
  for (int dim = 1; dim <= 9; ++dim) {
    SCOPED_TRACE(dim);
    const std::string id = Alloc(Spec(1, 2, dim));
    OwnedTensor k = RandomTensor(rng_, DType::kFloat32, 2, 1, dim);
    ASSERT_TRUE(store_->Append("", id, 0, 0, k.Arg(), k.Arg()).ok());
    ASSERT_TRUE(store_->Release("", id).ok());
    EXPECT_EQ(store_->Stats().pools.size(), 0u);
    EXPECT_EQ(store_->Stats().bytes_committed, 0u);
  }
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok());
}

TEST_F(BoundsTest, PoolIdsAreNeverReused) {
  const std::string a = Alloc(Spec(1, 2, 8));
  const uint64_t first = store_->Describe("", a)->info.pool_id;
  ASSERT_TRUE(store_->Release("", a).ok());
  const std::string b = Alloc(Spec(1, 2, 8));
  EXPECT_GT(store_->Describe("", b)->info.pool_id, first);
  EXPECT_THAT(store_->PoolBase(first), StatusIs(Code::kNotFound));
}

TEST_F(BoundsTest, MaxPoolsBoundsGeometries) {
  StoreOptions o = Options(size_t{64} << 20);
  o.max_pools = 2;
  MakeStore(o);
  Alloc(Spec(1, 2, 8));
  const std::string b = Alloc(Spec(1, 2, 16));
  ExpectExhausted(store_->Allocate("", Spec(1, 2, 32), ""), Refusal::kMaxPools, "max_pools=2");
  Alloc(Spec(2, 2, 8));  // an existing geometry is fine
  ASSERT_TRUE(store_->Release("", b).ok());
  EXPECT_TRUE(store_->Allocate("", Spec(1, 2, 32), "").ok());
}

TEST_F(BoundsTest, CachesAreBoundedPerSessionAndInAll) {
  StoreOptions o = Options(size_t{64} << 20);
  o.max_caches = 5;
  o.max_caches_per_session = 2;
  MakeStore(o);
  const std::string s = *store_->OpenSession("w");
  ASSERT_TRUE(store_->Allocate(s, Spec(1, 2, 8), "s1").ok());
  ASSERT_TRUE(store_->Allocate(s, Spec(1, 2, 8), "s2").ok());
  ExpectExhausted(store_->Allocate(s, Spec(1, 2, 8), "s3"), Refusal::kMaxCachesPerSession,
                  "max_caches_per_session=2");
  // The caches without a session count as one session.
  Alloc(Spec(1, 2, 8), "n1");
  Alloc(Spec(1, 2, 8), "n2");
  ExpectExhausted(store_->Allocate("", Spec(1, 2, 8), "n3"), Refusal::kMaxCachesPerSession,
                  "max_caches_per_session=2");
  const std::string t = *store_->OpenSession("w2");
  ASSERT_TRUE(store_->Allocate(t, Spec(1, 2, 8), "t1").ok());
  ExpectExhausted(store_->Allocate(t, Spec(1, 2, 8), "t2"), Refusal::kMaxCaches, "max_caches=5");
  ASSERT_TRUE(store_->Release(s, "s1").ok());
  EXPECT_TRUE(store_->Allocate(s, Spec(1, 2, 8), "s3").ok());
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok());
}

TEST_F(BoundsTest, SessionPageQuotaBoundsAppendAndReserve) {
  StoreOptions o = Options(size_t{64} << 20);
  o.session_max_pages = 3;
  MakeStore(o);
  const std::string s = *store_->OpenSession("w");
  ASSERT_TRUE(store_->Allocate(s, Spec(1, 2, 8), "a").ok());
  ASSERT_TRUE(store_->Allocate(s, Spec(1, 2, 8), "b").ok());
  ASSERT_TRUE(AppendTo(s, "a", 0, 8).ok());  // 2 pages of 4 tokens
  const ArenaStats before = store_->Stats();
  ExpectExhausted(AppendTo(s, "b", 0, 5), Refusal::kSessionMaxPages, "session_max_pages=3");
  ExpectExhausted(store_->Reserve(s, {{"a", 1}, {"b", 4}}), Refusal::kSessionMaxPages,
                  "session_max_pages=3");
  EXPECT_EQ(store_->Stats().pages.pages_used, before.pages.pages_used);
  ASSERT_TRUE(store_->Reserve(s, {{"b", 4}}).ok());  // the third page
  ASSERT_TRUE(store_->Release(s, "a").ok());
  EXPECT_TRUE(AppendTo(s, "b", 0, 8).ok());  // the quota came back with a's pages
  EXPECT_TRUE(store_->TEST_CheckInvariants().ok());
}

TEST_F(BoundsTest, SessionsAreBounded) {
  StoreOptions o = Options(size_t{16} << 20);
  o.max_sessions = 2;
  MakeStore(o);
  const std::string a = *store_->OpenSession("a");
  ASSERT_TRUE(store_->OpenSession("b").ok());
  ExpectExhausted(store_->OpenSession("c"), Refusal::kMaxSessions, "max_sessions=2");
  store_->DetachSession(a, absl::Seconds(1));
  // In its grace: still held.
  ExpectExhausted(store_->OpenSession("c"), Refusal::kMaxSessions, "max_sessions=2");
  clock_.Advance(absl::Seconds(1));
  store_->Reap();
  EXPECT_TRUE(store_->OpenSession("c").ok());
}

TEST_F(BoundsTest, SessionsOfOnePeerAreBounded) {
  StoreOptions o = Options(size_t{16} << 20);
  o.max_sessions = 8;
  o.max_sessions_per_peer = 2;
  MakeStore(o);
  SessionPeer uid;
  uid.key = "uid 1000";
  const std::string a = store_->AttachSession("a", "", uid)->session_id;
  ASSERT_TRUE(store_->AttachSession("b", "", uid).ok());
  ExpectExhausted(
      store_->AttachSession("c", "", uid), Refusal::kMaxSessionsPerPeer,
      "uid 1000 holds 2 sessions (attached or in their grace period); max_sessions_per_peer=2");
  // Another peer, and a peer the daemon cannot name, count against max_sessions only.
  SessionPeer other;
  other.key = "uid 1001";
  EXPECT_TRUE(store_->AttachSession("d", "", other).ok());
  EXPECT_TRUE(store_->OpenSession("e").ok());
  EXPECT_TRUE(store_->OpenSession("f").ok());
  EXPECT_TRUE(store_->OpenSession("g").ok());
  // The slot comes back when a session's grace ends.
  store_->DetachSession(a, absl::Seconds(1));
  ExpectExhausted(store_->AttachSession("c", "", uid), Refusal::kMaxSessionsPerPeer,
                  "max_sessions_per_peer=2");
  clock_.Advance(absl::Seconds(1));
  store_->Reap();
  EXPECT_TRUE(store_->AttachSession("c", "", uid).ok());
}

TEST_F(BoundsTest, IdleSessionlessCachesExpireOnTheClock) {
  StoreOptions o = Options(size_t{64} << 20);
  o.idle_ttl = absl::Seconds(10);
  MakeStore(o);
  const std::string idle = Alloc(Spec(1, 2, 8));
  const std::string busy = Alloc(Spec(1, 2, 8));
  const std::string s = *store_->OpenSession("w");
  ASSERT_TRUE(store_->Allocate(s, Spec(1, 2, 8), "owned").ok());
  ASSERT_TRUE(AppendTo("", idle, 0, 3).ok());
  clock_.Advance(absl::Seconds(6));
  ASSERT_TRUE(AppendTo("", busy, 0, 3).ok());
  clock_.Advance(absl::Seconds(4));
  EXPECT_EQ(store_->Reap(), 1);
  EXPECT_THAT(store_->Describe("", idle), StatusIs(Code::kNotFound));
  EXPECT_TRUE(store_->Describe("", busy).ok());
  EXPECT_TRUE(store_->Describe(s, "owned").ok());  // a session's caches live with the session
  clock_.Advance(absl::Seconds(10));               // the Describe above was a use of busy
  EXPECT_EQ(store_->Reap(), 1);
  EXPECT_EQ(store_->Stats().pages.pages_used, 0);
  EXPECT_EQ(store_->Stats().caches_reaped_idle, 2u);
  EXPECT_EQ(store_->Stats().caches_reaped_grace, 0u);
}

// The reaper walks the caches only when one may have expired (KvStore::Impl::TakeIdle):
// each cache must still go exactly when its last use + idle_ttl comes, whatever the scans
// before saw.
TEST_F(BoundsTest, IdleCachesExpireOnTimeBetweenSkippedScans) {
  StoreOptions o = Options(size_t{64} << 20);
  o.idle_ttl = absl::Seconds(10);
  MakeStore(o);
  const std::string first = Alloc(Spec(1, 2, 8));
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(store_->Reap(), 0);  // nothing expired; none can before first's use + 10s
  const std::string second = Alloc(Spec(1, 2, 8));
  clock_.Advance(absl::Seconds(3));
  const std::string third = Alloc(Spec(1, 2, 8));
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(store_->Reap(), 1);  // first, at exactly 10s
  EXPECT_THAT(store_->Describe("", first), StatusIs(Code::kNotFound));
  clock_.Advance(absl::Seconds(4));
  EXPECT_EQ(store_->Reap(), 0);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(store_->Reap(), 1);  // second, 10s after it was allocated
  EXPECT_THAT(store_->Describe("", second), StatusIs(Code::kNotFound));
  ASSERT_TRUE(store_->Describe("", third).ok());  // a use: third now lasts until 25s
  clock_.Advance(absl::Seconds(3));
  EXPECT_EQ(store_->Reap(), 0);  // 18s: third's allocation + 10s has passed, its use has not
  clock_.Advance(absl::Seconds(7));
  EXPECT_EQ(store_->Reap(), 1);
  EXPECT_EQ(store_->Stats().num_caches, 0);
  EXPECT_EQ(store_->Stats().caches_reaped_idle, 3u);
}

TEST_F(BoundsTest, RequestTokensAreBounded) {
  StoreOptions o = Options(size_t{64} << 20);
  o.max_request_tokens = 8;
  MakeStore(o);
  const std::string id = Alloc(Spec(1, 2, 8));
  auto r = AppendTo("", id, 0, 9);
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(std::string(r.message()), HasSubstr("must be in [1, 8]"));
  EXPECT_THAT(store_->Reserve("", {{id, 9}}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(store_->Commit("", {{id, 9}}), StatusIs(Code::kInvalidArgument));
  EXPECT_TRUE(AppendTo("", id, 0, 8).ok());
}

TEST_F(BoundsTest, GetKvRepliesAreBoundedAndPaged) {
  StoreOptions o = Options(size_t{64} << 20);
  // 8 tokens of K+V (2 heads x 8 dims x 4 bytes x 2) and the envelope, exactly.
  o.max_reply_bytes = 1024 + kGetKvReplyEnvelopeBytes;
  MakeStore(o);
  const std::string id = Alloc(Spec(1, 2, 8));
  ASSERT_TRUE(AppendRandom(id, 0, 20).ok());
  ExpectExhausted(store_->GetKv("", id, 0), Refusal::kMaxMessageBytes, "ask for at most 8 tokens");
  ExpectExhausted(store_->GetKv("", id, 0, GetKvRange{0, 9}), Refusal::kMaxMessageBytes,
                  "ask for at most 8 tokens");  // the advice is the most that fits
  std::string k, v;
  for (int64_t from = 0; from < 20; from += 8) {
    auto page = store_->GetKv("", id, 0, GetKvRange{from, 8});
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_EQ(page->first_pos, from);
    EXPECT_EQ(page->layer_len, 20);
    EXPECT_EQ(page->k.shape[2], std::min<int64_t>(8, 20 - from));
  }
  auto past = store_->GetKv("", id, 0, GetKvRange{int64_t{1} << 62, 0});
  ASSERT_TRUE(past.ok());
  EXPECT_EQ(past->k.shape[2], 0);
  EXPECT_EQ(past->first_pos, 20);
}

// Reserve + Commit without writing, then GetKv, once returned the bytes of the cache
// whose pages were freed last (another session's): pages are now cleared when handed out.
TEST_F(BoundsTest, PagesHandedOutNeverShowAnotherCachesBytes) {
  const std::string s1 = *store_->OpenSession("victim");
  const std::string s2 = *store_->OpenSession("reader");
  ASSERT_TRUE(store_->Allocate(s1, Spec(2, 2, 8), "secret").ok());
  for (int l = 0; l < 2; ++l) {
    OwnedTensor k = RandomTensor(rng_, DType::kFloat32, 2, 16, 8);
    ASSERT_TRUE(store_->Append(s1, "secret", l, 0, k.Arg(), k.Arg()).ok());
  }
  ASSERT_TRUE(store_->Release(s1, "secret").ok());

  // Local path: reserved pages, committed unwritten.
  ASSERT_TRUE(store_->Allocate(s2, Spec(2, 2, 8), "reserve").ok());
  ASSERT_TRUE(store_->Reserve(s2, {{"reserve", 16}}).ok());
  ASSERT_TRUE(store_->Commit(s2, {{"reserve", 16}}).ok());
  // Served path: the tail of an appended page, then committed over.
  ASSERT_TRUE(store_->Allocate(s2, Spec(2, 2, 8), "tail").ok());
  OwnedTensor one = RandomTensor(rng_, DType::kFloat32, 2, 1, 8);
  for (int l = 0; l < 2; ++l)
    ASSERT_TRUE(store_->Append(s2, "tail", l, 0, one.Arg(), one.Arg()).ok());
  ASSERT_TRUE(store_->Commit(s2, {{"tail", 3}}).ok());

  // Tokens this test did not write read as zeros: [heads][tokens][8 floats] per tensor.
  auto expect_zeros_from = [](const TensorOut& t, int64_t first_unwritten) {
    const int64_t heads = t.shape[1], n = t.shape[2];
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = first_unwritten; i < n; ++i) {
        const size_t at = size_t((h * n + i) * 32);
        ASSERT_EQ(t.data.substr(at, 32), std::string(32, '\0')) << "head " << h << " token " << i;
      }
    }
  };
  for (const char* id : {"reserve", "tail"}) {
    for (int l = 0; l < 2; ++l) {
      SCOPED_TRACE(absl::StrCat(id, " layer ", l));
      auto kv = store_->GetKv(s2, id, l);
      ASSERT_TRUE(kv.ok()) << kv.status();
      const int64_t written = std::string(id) == "tail" ? 1 : 0;
      expect_zeros_from(kv->k, written);
      expect_zeros_from(kv->v, written);
    }
  }
}

// Found by the fuzzer: a Reserve over two pools whose second pool refused once left the
// chunk the first committed for it in place (empty, but charged to the arena).
TEST_F(BoundsTest, ARefusedReserveLeavesNoChunkCommitted) {
  StoreOptions o = Options(size_t{4} << 20);  // two chunks
  o.scratch_bytes = 0;
  MakeStore(o);
  Alloc(Spec(1, 2, 8), "a");   // 256-byte pages: 8192 per chunk
  Alloc(Spec(1, 2, 16), "b");  // 512-byte pages: 4096 per chunk
  const ArenaStats before = store_->Stats();
  ExpectExhausted(store_->Reserve("", {{"a", 4}, {"b", 4 * 4096 * 2}}), Refusal::kArenaFull,
                  "arena full");
  EXPECT_EQ(store_->Stats().bytes_committed, before.bytes_committed);
  EXPECT_EQ(store_->Stats().pages.pages_free, before.pages.pages_free);
  EXPECT_TRUE(store_->Reserve("", {{"b", 4 * 4096}}).ok());  // the budget is all there
}

// The reaper once released by cache id: an id the expired session had released and
// another session had taken since went too.
TEST_F(BoundsTest, TheReaperReleasesOnlyWhatTheSessionStillOwns) {
  const std::string s1 = *store_->OpenSession("w1");
  const std::string s2 = *store_->OpenSession("w2");
  ASSERT_TRUE(store_->Allocate(s1, Spec(1, 2, 8), "x").ok());
  ASSERT_TRUE(store_->Allocate(s1, Spec(1, 2, 8), "mine").ok());
  ASSERT_TRUE(store_->Release(s1, "x").ok());
  ASSERT_TRUE(store_->Allocate(s2, Spec(1, 2, 8), "x").ok());
  store_->DetachSession(s1, absl::ZeroDuration());
  EXPECT_EQ(store_->Reap(), 1);
  EXPECT_TRUE(store_->Describe(s2, "x").ok());
  EXPECT_THAT(store_->CacheStats("mine"), StatusIs(Code::kNotFound));
}

}  // namespace
}  // namespace kvarena
