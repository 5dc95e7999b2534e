// The identity of a prefix in the disk tier of a real kvarenad (docs/tiers.md): a daemon
// with tenants computes a prompt in a quantized KV format (int8, fp8_e4m3 with non-unit
// static scales) and is stopped, SIGTERM writing its cached pages to the disk; the
// restarted daemon (and the arena before it) serves none of them to a cache that differs
// in one identity field — KV format, one static scale, page size, kv heads, head_dim,
// layers, activation dtype, namespace, tenant — while the unchanged identity loads every
// full chunk, and its K/V read back equal the first cache's bit for bit: no tier converts
// the stored codes.
#include <signal.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/daemon/identity_kv.h"

namespace kvarena {
namespace {

class TierIdentityTest : public ::testing::TestWithParam<v1::KvFormat> {
 protected:
  void SetUp() override { std::printf("prompt from fixed seed 7\n"); }
  void TearDown() override {
    if (HasFailure() && daemon_ != nullptr)
      std::fprintf(stderr, "kvarenad log:\n%s\n", daemon_->Log().c_str());
  }

  void Start() {
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{
        "--arena_bytes=64Mi", "--tier_chunk_pages=2", "--tier_disk_dir=" + disk_.path(),
        "--tier_disk_bytes=1Mi", IdentityTenantsFlag(files_)});
    ASSERT_TRUE(daemon_->WaitServing()) << daemon_->Log();
    stub_ = v1::KvCacheService::NewStub(daemon_->NewChannel());
  }

  int ChunkFiles() const {
    int n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(disk_.path()))
      n += e.is_regular_file() && e.path().extension() == ".kvc";
    return n;
  }

  TempDir disk_, files_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<v1::KvCacheService::Stub> stub_;
};

TEST_P(TierIdentityTest, ARestartedDaemonServesTheDiskOnlyToTheSameIdentityBitForBit) {
  const v1::CacheSpec base = IdentityBase(GetParam());
  const Prompt p = MakePrompt(17, 7);  // 4 full pages: 2 chunks of 2 pages
  ASSERT_NO_FATAL_FAILURE(Start());
  const v1::CacheInfo a = AllocateAs(stub_.get(), kIdentityAlice, base, p.tokens);
  ASSERT_NO_FATAL_FAILURE(ComputeAs(stub_.get(), kIdentityAlice, a.cache_id(), p));
  const std::vector<std::string> before = KvBytesAs(stub_.get(), kIdentityAlice, a.cache_id(), 16);
  ASSERT_NO_FATAL_FAILURE(ReleaseAs(stub_.get(), kIdentityAlice, a.cache_id()));
  // In the arena first: the flips miss, the base hits there.
  ASSERT_NO_FATAL_FAILURE(ExpectFlipsMiss(stub_.get(), base, p.tokens));
  const v1::CacheInfo hit = AllocateAs(stub_.get(), kIdentityAlice, base, p.tokens);
  EXPECT_EQ(hit.cached_tokens(), 16u);
  EXPECT_EQ(hit.tier_loaded_tokens(), 0u);
  ASSERT_NO_FATAL_FAILURE(ReleaseAs(stub_.get(), kIdentityAlice, hit.cache_id()));
  // A graceful stop writes the two chunks down to the disk (the channel closed first, so
  // that the daemon need not wait for it).
  stub_.reset();
  daemon_->Signal(SIGTERM);
  ASSERT_TRUE(daemon_->WaitExit(absl::Seconds(30)).has_value());
  ASSERT_EQ(ChunkFiles(), 2);
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(ExpectFlipsMiss(stub_.get(), base, p.tokens));
  const v1::CacheInfo b = AllocateAs(stub_.get(), kIdentityAlice, base, p.tokens);
  EXPECT_EQ(b.cached_tokens(), 16u);
  EXPECT_EQ(b.tier_loaded_tokens(), 16u);
  ExpectSameKv(KvBytesAs(stub_.get(), kIdentityAlice, b.cache_id(), 16), before);
}

INSTANTIATE_TEST_SUITE_P(Quantized, TierIdentityTest, QuantizedKvFormats(), KvFormatParamName);

}  // namespace
}  // namespace kvarena
