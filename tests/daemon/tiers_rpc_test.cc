// The tiers below the arena in a real kvarenad (docs/tiers.md): a prefix pushed out of the
// arena comes back from the host tier, then from the disk tier once the host tier
// overflows, and from the disk after a restart; a corrupt, truncated or swapped chunk file
// is a miss, never wrong K/V; a disk too small drops writes and counts them; a daemon
// SIGKILLed while writing leaves nothing that verifies wrongly. Outputs after a tier hit
// equal a recompute's bit for bit.
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/daemon/prompt_kv.h"
#include "tests/support/temp_dir.h"

namespace kvarena {
namespace {

namespace fs = std::filesystem;

constexpr int kLayers = kPromptLayers, kHeads = kPromptHeads, kDim = kPromptDim;

class TiersRpcTest : public KvarenadTest {
 protected:
  void SetUp() override { std::printf("prompts from fixed seeds 1..40\n"); }

  // A daemon with a 2 MiB arena (its smallest: 4096 pages of 512 bytes) and tier chunks of
  // 2 pages (2 layers: 2 KiB).
  void Start(const std::vector<std::string>& tier_flags) {
    std::vector<std::string> flags = {"--arena_bytes=2Mi", "--tier_chunk_pages=2"};
    flags.insert(flags.end(), tier_flags.begin(), tier_flags.end());
    StartDaemon(flags);
  }

  v1::CacheInfo AllocatePrompt(const std::vector<int32_t>& tokens) {
    return kvarena::AllocatePrompt(stub_.get(), tokens);
  }
  void Compute(const std::string& id, const Prompt& p, int from) {
    ComputePrompt(stub_.get(), id, p, from);
  }
  void Release(const std::string& id) { ReleaseCache(stub_.get(), id); }

  // Computes p in a cache and releases it: its pages stay cached in the arena.
  void ComputeAndRelease(const Prompt& p) {
    const v1::CacheInfo a = AllocatePrompt(p.tokens);
    ASSERT_NO_FATAL_FAILURE(Compute(a.cache_id(), p, int(a.cached_tokens())));
    ASSERT_NO_FATAL_FAILURE(Release(a.cache_id()));
  }

  // Fills the whole arena with a namespace-less cache, evicting every cached page.
  void Pressure() {
    const std::string id = Allocate(Spec(kLayers, kHeads, kDim));
    for (uint32_t l = 0; l < kLayers; ++l)
      ASSERT_TRUE(AppendF32(id, l, 0, 2048 * 4, kHeads, kDim, 1.0f).ok());
    ASSERT_NO_FATAL_FAILURE(Release(id));
  }

  // Waits (bounded) until the tier of `medium` stored `chunks` chunks.
  void WaitStored(const std::string& medium, uint64_t chunks) {
    for (int i = 0; i < 500; ++i) {
      const v1::StatsResponse stats = Stats();
      for (const v1::TierStats& t : stats.tiers()) {
        if (t.medium() == medium && t.stored_chunks() >= chunks) return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    FAIL() << medium << " never stored " << chunks << " chunks: " << Stats().DebugString();
  }

  v1::TierStats Tier(const std::string& medium) {
    const v1::StatsResponse stats = Stats();
    for (const v1::TierStats& t : stats.tiers()) {
      if (t.medium() == medium) return t;
    }
    ADD_FAILURE() << "no tier " << medium;
    return {};
  }

  // A new cache for p's prompt must take `loaded` positions from the tiers, and then hold
  // and attend exactly as a cache that computed everything.
  void ExpectLoaded(const Prompt& p, int loaded) {
    const v1::CacheInfo b = AllocatePrompt(p.tokens);
    EXPECT_EQ(b.tier_loaded_tokens(), uint64_t(loaded));
    EXPECT_EQ(b.cached_tokens(), uint64_t(loaded));
    ASSERT_NO_FATAL_FAILURE(ExpectRecomputed(b, p));
  }

  void ExpectRecomputed(const v1::CacheInfo& b, const Prompt& p) {
    ExpectAsRecomputed(stub_.get(), b, p, absl::StrCat("recompute-", recomputes_++));
  }

  std::vector<std::string> ChunkFiles() const {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(disk_.path())) {
      if (e.is_regular_file() && e.path().extension() == ".kvc") out.push_back(e.path());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  TempDir disk_;
  int recomputes_ = 0;
};

TEST_F(TiersRpcTest, EvictedPrefixComesBackFromHostThenFromDiskOnceHostOverflows) {
  // The host tier holds one 2-page chunk of 2 layers (about 2.2 KB), the disk many.
  Start({"--tier_host_bytes=3000", "--tier_disk_dir=" + disk_.path(), "--tier_disk_bytes=1Mi"});
  const Prompt first = MakePrompt(9, 1), second = MakePrompt(9, 2);  // one chunk each
  ASSERT_NO_FATAL_FAILURE(ComputeAndRelease(first));
  ASSERT_NO_FATAL_FAILURE(Pressure());
  ASSERT_NO_FATAL_FAILURE(WaitStored("host", 1));
  ASSERT_NO_FATAL_FAILURE(ExpectLoaded(first, 8));
  EXPECT_EQ(Tier("host").hit_chunks(), 1u);
  // The second prefix pushes the first out of the host tier, down to disk.
  ASSERT_NO_FATAL_FAILURE(ComputeAndRelease(second));
  ASSERT_NO_FATAL_FAILURE(Pressure());
  ASSERT_NO_FATAL_FAILURE(WaitStored("disk", 1));
  ASSERT_NO_FATAL_FAILURE(ExpectLoaded(first, 8));
  EXPECT_EQ(Tier("disk").hit_chunks(), 1u);
  EXPECT_EQ(Tier("disk").loaded_tokens(), 8u);
}

TEST_F(TiersRpcTest, ARestartedDaemonServesThePrefixFromDisk) {
  Start({"--tier_disk_dir=" + disk_.path(), "--tier_disk_bytes=1Mi"});
  const Prompt p = MakePrompt(17, 3);  // two chunks
  ASSERT_NO_FATAL_FAILURE(ComputeAndRelease(p));
  // A graceful stop writes what the arena still caches down to the disk.
  daemon_->Signal(SIGTERM);
  ASSERT_TRUE(daemon_->WaitExit(absl::Seconds(30)).has_value());
  EXPECT_EQ(ChunkFiles().size(), 2u);
  Start({"--tier_disk_dir=" + disk_.path(), "--tier_disk_bytes=1Mi"});
  ASSERT_NO_FATAL_FAILURE(ExpectLoaded(p, 16));
  EXPECT_EQ(Tier("disk").chunks(), 2u);
}

TEST_F(TiersRpcTest, CorruptTruncatedOrSwappedChunkFilesAreMissesNeverWrongKv) {
  Start({"--tier_disk_dir=" + disk_.path(), "--tier_disk_bytes=1Mi", "--tier_write_through"});
  const Prompt a = MakePrompt(9, 4), b = MakePrompt(9, 5), c = MakePrompt(9, 6);
  for (const Prompt* p : {&a, &b, &c}) ASSERT_NO_FATAL_FAILURE(ComputeAndRelease(*p));
  ASSERT_NO_FATAL_FAILURE(WaitStored("disk", 3));
  daemon_->Signal(SIGKILL);
  (void)daemon_->WaitExit(absl::Seconds(10));
  std::vector<std::string> files = ChunkFiles();
  ASSERT_EQ(files.size(), 3u);
  // The third holds the first's (intact) chunk under its own name; then one flipped byte
  // in the first and the second truncated.
  fs::remove(files[2]);
  fs::copy_file(files[0], files[2]);
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x5a');
  }
  fs::resize_file(files[1], fs::file_size(files[1]) / 2);
  Start({"--tier_disk_dir=" + disk_.path(), "--tier_disk_bytes=1Mi"});
  for (const Prompt* p : {&a, &b, &c}) {
    const v1::CacheInfo info = AllocatePrompt(p->tokens);
    EXPECT_EQ(info.cached_tokens(), 0u);  // every one of them fails verification
  }
  EXPECT_EQ(Tier("disk").corrupt_chunks(), 3u);
  EXPECT_EQ(Tier("disk").hit_chunks(), 0u);
}

TEST_F(TiersRpcTest, ADiskTooSmallForAChunkDropsTheWriteAndCountsIt) {
  Start({"--tier_disk_dir=" + disk_.path(), "--tier_disk_bytes=1000"});
  const Prompt p = MakePrompt(9, 7);
  ASSERT_NO_FATAL_FAILURE(ComputeAndRelease(p));
  ASSERT_NO_FATAL_FAILURE(Pressure());
  for (int i = 0; i < 500 && Tier("disk").dropped_writes() == 0; ++i)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(Tier("disk").dropped_writes(), 1u);
  EXPECT_EQ(AllocatePrompt(p.tokens).cached_tokens(), 0u);
  EXPECT_TRUE(ChunkFiles().empty());
}

TEST_F(TiersRpcTest, ADaemonKilledWhileWritingLeavesNothingThatVerifiesWrongly) {
  Start({"--tier_disk_dir=" + disk_.path(), "--tier_disk_bytes=1Mi", "--tier_write_through"});
  std::vector<Prompt> prompts;
  for (uint32_t s = 10; s < 40; ++s) prompts.push_back(MakePrompt(9, s));
  for (const Prompt& p : prompts) ASSERT_NO_FATAL_FAILURE(ComputeAndRelease(p));
  daemon_->Signal(SIGKILL);  // while the writer is still writing (fsync per file)
  (void)daemon_->WaitExit(absl::Seconds(10));
  Start({"--tier_disk_dir=" + disk_.path(), "--tier_disk_bytes=1Mi"});
  int hits = 0;
  for (const Prompt& p : prompts) {
    const v1::CacheInfo info = AllocatePrompt(p.tokens);
    if (info.tier_loaded_tokens() > 0) ++hits;
    ASSERT_NO_FATAL_FAILURE(ExpectRecomputed(info, p));  // what loads is exactly what was computed
  }
  std::printf("%d of %zu prefixes survived the SIGKILL\n", hits, prompts.size());
  EXPECT_EQ(Tier("disk").corrupt_chunks(), 0u);
}

TEST_F(TiersRpcTest, StatsMetricsAndEventsNameTheTiers) {
  const int port = PickUnusedPort();
  Start({"--tier_host_bytes=1Mi", "--metrics_port=" + std::to_string(port)});
  const Prompt p = MakePrompt(9, 8);
  ASSERT_NO_FATAL_FAILURE(ComputeAndRelease(p));
  ASSERT_NO_FATAL_FAILURE(Pressure());
  ASSERT_NO_FATAL_FAILURE(WaitStored("host", 1));
  const v1::TierStats host = Tier("host");
  EXPECT_TRUE(host.up());
  EXPECT_EQ(host.bytes_limit(), 1u << 20);
  EXPECT_EQ(host.chunks(), 1u);
  const std::string metrics = GetMetrics(port);
  EXPECT_THAT(metrics, ::testing::HasSubstr("kvarena_tier_stored_chunks_total{medium=\"host\"} 1"));
  EXPECT_THAT(metrics, ::testing::HasSubstr(
                           "kvarena_tier_duration_seconds_bucket{medium=\"host\",op=\"write\""));
  // WatchEvents: the host tier's BlockStored comes before the arena's BlockRemoved.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::WatchEventsRequest req;
  auto reader = stub_->WatchEvents(&ctx, req);
  v1::WatchEventsResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  int host_stored = 0, arena_removed_after = 0;
  for (const v1::KvEvent& e : resp.events()) {
    if (e.has_stored() && e.stored().medium() == "host") ++host_stored;
    if (e.has_removed() && e.removed().medium() == "cpu" && host_stored > 0) ++arena_removed_after;
  }
  EXPECT_EQ(host_stored, 2 * kLayers);
  EXPECT_EQ(arena_removed_after, 2 * kLayers);
  ctx.TryCancel();
}

}  // namespace
}  // namespace kvarena
