// Prefix reuse across real processes: kvarena_prefix_worker processes (a deterministic toy
// model, tests/mp/prefix_worker.cc) against a real kvarenad. A worker that finds a prompt
// another worker computed adopts its full pages (CacheInfo.cached_tokens) and computes
// only the rest; its outputs equal a run without reuse that makes the same calls, bit for
// bit; pages are shared, not copied; namespaces, geometry and token ids bound what is
// shared; forced hash collisions are caught; cached pages give way under pressure before
// anything is refused; and a worker SIGKILLed holding adopted pages leaves the counts exact.
#include <signal.h>

#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/mp/mp_fixture.h"

namespace kvarena::testing {
namespace {

// The worker's defaults: 4 layers, page_size 16, a 200-token prompt, 8 decoded tokens.
constexpr int kLayers = 4;
constexpr int64_t kPromptPages = 12;  // floor((200 - 1) / 16): the last position is computed
constexpr int64_t kCached = kPromptPages * 16;
constexpr int64_t kPagesOfOne = 13 * kLayers;  // 208 tokens

class PrefixReuseTest : public MultiProcessTest {
 protected:
  std::unique_ptr<Subprocess> Start(const std::vector<std::string>& flags) {
    return StartProgram(KVARENA_PREFIX_WORKER_PATH, flags);
  }
  // Runs a worker to its end (exit 0 expected) and returns its cached_tokens.
  int64_t Run(const std::vector<std::string>& flags, const std::string& name) {
    auto p = Start(flags);
    ExpectExitsOk(*p, name);
    return CachedOf(*p);
  }
  static int64_t CachedOf(const Subprocess& p) {
    const std::string out = p.output();
    const size_t at = out.find("cached_tokens=");
    int64_t n = -1;
    if (at != std::string::npos) {
      const size_t end = out.find(' ', at);
      (void)absl::SimpleAtoi(out.substr(at + 14, end - at - 14), &n);
    }
    return n;
  }
  std::string Path(const std::string& name) const { return dir() + "/" + name; }
  // "pos layer" -> the fnv of that output row.
  static std::map<std::string, std::string> Outputs(const std::string& path) {
    std::map<std::string, std::string> rows;
    std::ifstream in(path);
    std::string pos, layer, fnv;
    while (in >> pos >> layer >> fnv) rows[pos + " " + layer] = fnv;
    return rows;
  }
  ArenaStats Stats() {
    auto s = Observer()->Stats();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : ArenaStats{};
  }
  // Every row of `got` equals the same row of `want`; returns how many were compared.
  static int ExpectSameRows(const std::map<std::string, std::string>& got,
                            const std::map<std::string, std::string>& want) {
    int n = 0;
    for (const auto& [key, fnv] : got) {
      auto it = want.find(key);
      EXPECT_TRUE(it != want.end()) << "row " << key << " missing";
      if (it == want.end()) continue;
      EXPECT_EQ(fnv, it->second) << "row " << key;
      ++n;
    }
    return n;
  }
};

TEST_F(PrefixReuseTest, SecondWorkerAdoptsThePrefixAndMatchesARunWithoutReuseBitForBit) {
  StartDaemon();
  auto a = Start({"--out=" + Path("a.txt"), "--hold"});
  ASSERT_TRUE(a->WaitForOutput("holding", kEventBound)) << a->output();
  EXPECT_EQ(CachedOf(*a), 0);
  const int64_t one = Stats().pages.pages_used;
  EXPECT_EQ(one, kPagesOfOne);

  auto b = Start({"--out=" + Path("b.txt"), "--hold", absl::StrCat("--expect_cached=", kCached)});
  ASSERT_TRUE(b->WaitForOutput("holding", kEventBound)) << b->output();
  const ArenaStats both = Stats();
  // b references 13 pages per layer but owns 1: the arena holds 56, not 104.
  EXPECT_EQ(both.pages.pages_used, one + kLayers);
  EXPECT_EQ(both.pages.pages_shared, kPromptPages * kLayers);
  EXPECT_EQ(both.pages.prefix_hit_tokens, uint64_t(kCached));
  std::printf("pages: one worker %lld, both %lld (without reuse %lld): %.0f%% saved\n",
              static_cast<long long>(one), static_cast<long long>(both.pages.pages_used),
              static_cast<long long>(2 * one),
              100.0 * (1.0 - double(both.pages.pages_used) / double(2 * one)));

  // The same calls without reuse: the prompt up to kCached, then the rest, then decode.
  EXPECT_EQ(
      Run({"--prefix_namespace=", absl::StrCat("--split_at=", kCached), "--out=" + Path("r.txt")},
          "r"),
      0);
  const auto rb = Outputs(Path("b.txt")), rr = Outputs(Path("r.txt")), ra = Outputs(Path("a.txt"));
  EXPECT_EQ(rb.size(), size_t((200 + 8 - kCached) * kLayers));
  EXPECT_EQ(ExpectSameRows(rb, rr), int(rb.size()));
  // Decode steps are the same calls in a and b too.
  std::map<std::string, std::string> decode_b;
  for (const auto& [key, fnv] : rb) {
    if (std::stoi(key) >= 200) decode_b[key] = fnv;
  }
  EXPECT_EQ(ExpectSameRows(decode_b, ra), 8 * kLayers);

  a->Signal(SIGUSR1);
  b->Signal(SIGUSR1);
  ExpectExitsOk(*a, "a");
  ExpectExitsOk(*b, "b");
  EXPECT_TRUE(WaitForArena([](const ArenaStats& s) { return s.num_caches == 0; }));
  const ArenaStats after = Stats();
  EXPECT_EQ(after.pages.pages_used, 0);
  EXPECT_EQ(after.pages.pages_shared, 0);
  // a's full pages; b's duplicate was private. (Seen once at 0 under ASan in a CI run and
  // not reproduced since; the counts below say where the pages went if it happens again.)
  EXPECT_EQ(after.pages.pages_cached, kPagesOfOne)
      << "pools=" << after.pools.size() << " pages_free=" << after.pages.pages_free
      << " evicted_lru=" << after.pages.pages_evicted_lru
      << " evicted=" << after.pages.pages_evicted << " caches=" << after.num_caches;
  EXPECT_EQ(after.pages.prefix_lookups, 2u);  // r had no namespace: no lookup
}

TEST_F(PrefixReuseTest, TheLocalPathAdoptsFromCachedPagesToo) {
  StartDaemon();
  EXPECT_EQ(Run({}, "a"), 0);  // computes and releases: its pages stay cached
  EXPECT_EQ(Stats().pages.pages_cached, kPagesOfOne);
  EXPECT_EQ(
      Run({"--local", "--out=" + Path("b.txt"), absl::StrCat("--expect_cached=", kCached)}, "b"),
      kCached);
  EXPECT_EQ(Run({"--local", "--prefix_namespace=", absl::StrCat("--split_at=", kCached),
                 "--out=" + Path("r.txt")},
                "r"),
            0);
  const auto rb = Outputs(Path("b.txt"));
  EXPECT_EQ(ExpectSameRows(rb, Outputs(Path("r.txt"))), int(rb.size()));
  EXPECT_GT(rb.size(), 0u);
}

TEST_F(PrefixReuseTest,
       TheLocalPathOverAPrefixFromTheDiskTierAfterARestartMatchesARunWithoutReuse) {
  // Chunks of 4 pages: the 12 cached pages of the prompt are 3 chunks. Odd layers slide.
  const std::vector<std::string> tier = {"--tier_disk_dir=" + Path("tier"),
                                         "--tier_disk_bytes=64Mi", "--tier_chunk_pages=4"};
  StartDaemonWith(tier);
  EXPECT_EQ(Run({"--window=32"}, "a"), 0);  // computes and releases: its pages stay cached
  // A graceful stop hands what the arena caches down to the disk; a new daemon finds it.
  daemon().Signal(SIGTERM);
  ASSERT_TRUE(daemon().Wait(kEventBound).ok());
  StartDaemonWith(tier);
  EXPECT_EQ(Run({"--local", "--window=32", "--out=" + Path("b.txt"),
                 absl::StrCat("--expect_cached=", kCached)},
                "b"),
            kCached);
  const ArenaStats s = Stats();
  ASSERT_EQ(s.tiers.size(), 1u);
  EXPECT_EQ(s.tiers[0].medium, "disk");
  EXPECT_EQ(s.tiers[0].loaded_tokens, uint64_t(kCached));
  EXPECT_EQ(Run({"--local", "--window=32", "--prefix_namespace=",
                 absl::StrCat("--split_at=", kCached), "--out=" + Path("r.txt")},
                "r"),
            0);
  const auto rb = Outputs(Path("b.txt"));
  EXPECT_GT(rb.size(), 0u);
  EXPECT_EQ(ExpectSameRows(rb, Outputs(Path("r.txt"))), int(rb.size()));
}

TEST_F(PrefixReuseTest, NamespacesGeometryAndTokenIdsBoundWhatIsShared) {
  StartDaemon();
  EXPECT_EQ(Run({}, "a"), 0);
  EXPECT_EQ(Run({"--prefix_namespace=other-model", "--expect_cached=0"}, "other namespace"), 0);
  EXPECT_EQ(Run({"--prefix_namespace=", "--expect_cached=0"}, "no namespace"), 0);
  EXPECT_EQ(Run({"--head_dim=128", "--expect_cached=0"}, "other geometry"), 0);
  EXPECT_EQ(Run({"--layers=3", "--expect_cached=0"}, "other layer count"), 0);
  EXPECT_EQ(Run({"--differ_at=40", "--expect_cached=32"}, "token 40 differs"), 32);
  EXPECT_EQ(Run({"--differ_at=0", "--expect_cached=0"}, "token 0 differs"), 0);
  EXPECT_EQ(Run({"--prompt_len=100", "--expect_cached=96"}, "a shorter prompt"), 96);
  // The answer a decoded (ids declared with SetTokens) is found by a longer next turn...
  EXPECT_EQ(Run({"--previous_answer=8", "--expect_cached=208"}, "next turn"), 208);
  // ...and sliding layers (odd layers, window 32) are another identity (a window changes the
  // K/V of every layer after it): a's pages are not theirs; a second sliding worker hits the
  // first's with only the pages they still see.
  EXPECT_EQ(Run({"--window=32", "--expect_cached=0"}, "sliding, first"), 0);
  EXPECT_EQ(Run({"--window=32", absl::StrCat("--expect_cached=", kCached)}, "sliding"), kCached);
}

TEST_F(PrefixReuseTest, ForcedHashCollisionsAreRejectedByTheTokenCheck) {
  StartDaemonWith({"--test_prefix_hash_bits=0"});  // every page hash collides
  EXPECT_EQ(Run({}, "a"), 0);
  // Another prompt finds a's pages under every hash, and takes none: its K/V and outputs
  // are checked against its own model by the worker.
  EXPECT_EQ(Run({"--prompt_seed=2", "--expect_cached=0"}, "other prompt"), 0);
  EXPECT_EQ(Run({"--differ_at=20", "--expect_cached=16"}, "second page differs"), 16);
  // a's own prompt hits its first page only: its second page's hash names the first's node.
  EXPECT_EQ(Run({"--expect_cached=16"}, "same prompt"), 16);
}

TEST_F(PrefixReuseTest, CachedPagesAreReclaimedUnderPressureBeforeAnyRefusal) {
  // 8 MiB = 4 chunks of 128 pages (16 KiB each); no scratch regions (tensors inline).
  StartDaemonWith({"--arena_bytes=8Mi", "--scratch_bytes=0"});
  EXPECT_EQ(Run({"--prompt_len=1000"}, "a"), 0);
  const ArenaStats cached = Stats();
  EXPECT_EQ(cached.pages.pages_cached, 63 * kLayers);
  // b needs 380 pages, more than are free: the oldest cached pages (a's tail) go first.
  EXPECT_EQ(Run({"--prompt_seed=2", "--prompt_len=1500"}, "b"), 0);
  const ArenaStats squeezed = Stats();
  EXPECT_GT(squeezed.pages.pages_evicted_lru, 0u);
  EXPECT_EQ(squeezed.pages.refusals, 0u);
  // a's head survived: its prompt still hits a shorter prefix, whose K/V the worker checks.
  const int64_t hit = Run({"--prompt_len=1000"}, "a again");
  EXPECT_GT(hit, 0);
  EXPECT_LT(hit, 992);
  EXPECT_EQ(Stats().pages.refusals, 0u);
}

TEST_F(PrefixReuseTest, ForkThenDivergentAppendsLeaveEachOtherUntouched) {
  StartDaemon();
  EXPECT_EQ(Run({"--fork"}, "served fork"), 0);
  EXPECT_EQ(Run({"--fork", "--local", "--prompt_seed=3"}, "local fork"), 0);
  const ArenaStats s = Stats();
  EXPECT_EQ(s.pages.forks, 2u);
  EXPECT_GE(s.pages.cow_copies, uint64_t(2 * kLayers));  // each fork's popn cut into a shared page
  EXPECT_EQ(s.pages.pages_used, 0);
}

TEST_F(PrefixReuseTest, RefcountsStayExactWhenAWorkerHoldingAdoptedPagesIsKilled) {
  StartDaemon("200ms");
  EXPECT_EQ(Run({}, "a"), 0);
  const std::string expect = absl::StrCat("--expect_cached=", kCached);
  auto b1 = Start({"--pause_after_prefill", expect});
  auto b2 = Start({"--pause_after_prefill", expect});
  ASSERT_TRUE(b1->WaitForOutput("paused after prefill", kEventBound)) << b1->output();
  ASSERT_TRUE(b2->WaitForOutput("paused after prefill", kEventBound)) << b2->output();
  ArenaStats held = Stats();
  // Both reference the 48 adopted pages; each owns the page of positions 192..199.
  EXPECT_EQ(held.pages.pages_used, kPromptPages * kLayers + 2 * kLayers);
  EXPECT_EQ(held.pages.pages_shared, kPromptPages * kLayers);
  EXPECT_EQ(held.pages.pages_cached, kLayers);  // a's last page (its decoded tokens)
  b1->Signal(SIGKILL);
  ASSERT_TRUE(b1->Wait(kEventBound).ok());
  ASSERT_TRUE(
      WaitForArena([](const ArenaStats& s) { return s.num_sessions == 1 && s.num_caches == 1; }));
  held = Stats();
  EXPECT_EQ(held.pages.pages_used, kPromptPages * kLayers + kLayers);
  EXPECT_EQ(held.pages.pages_shared, 0);
  EXPECT_EQ(held.pages.pages_cached, kLayers);
  b2->Signal(SIGUSR1);  // its K/V are intact: it decodes and checks them
  ExpectExitsOk(*b2, "b2");
  ASSERT_TRUE(WaitForArena([](const ArenaStats& s) { return s.num_caches == 0; }));
  const ArenaStats after = Stats();
  EXPECT_EQ(after.pages.pages_used, 0);
  EXPECT_EQ(after.pages.pages_cached, kPagesOfOne);
  EXPECT_EQ(Run({expect}, "c"), kCached);
}

}  // namespace
}  // namespace kvarena::testing
