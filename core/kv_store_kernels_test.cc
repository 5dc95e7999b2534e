// KvStore over fault injectors wrapping the real KvKernels and Backend: what core does
// when the kernels refuse a geometry or fail on the device, and when committing memory
// fails midway. Every failure gives back what the call took.
#include "base/status_macros.h"
#include "core/refusal.h"
#include "core/store_fixture.h"
#include "tests/support/forwarding_kernels.h"

namespace kvarena {
namespace {

// Wraps the real CPU kernels and fails the calls it is told to (a device error).
class FaultyKvKernels : public testing::ForwardingKvKernels {
 public:
  FaultyKvKernels() : ForwardingKvKernels(NewCpuKvKernels(0)) {}
  std::string name() const override { return "faulty"; }
  absl::Status CheckLayout(const PageLayout& layout) const override {
    if (layout.head_dim == 96) return absl::InvalidArgumentError("spec.head_dim=96 is not served");
    return absl::OkStatus();
  }
  absl::Status ClearPages(const PageLayout& layout, uint8_t* pool_base, const int32_t* ids,
                          int64_t n) override {
    if (fail_clear) return absl::InternalError("injected ClearPages failure");
    return ForwardingKvKernels::ClearPages(layout, pool_base, ids, n);
  }
  absl::Status CopyPages(const PageLayout& layout, uint8_t* pool_base, const PageCopy* copies,
                         int64_t n) override {
    if (fail_copy) return absl::InternalError("injected CopyPages failure");
    return ForwardingKvKernels::CopyPages(layout, pool_base, copies, n);
  }
  absl::Status AppendKv(const PagedKvView& view, int64_t pos, int64_t n, const void* k,
                        const void* v) override {
    if (fail_append) return absl::InternalError("injected AppendKv failure");
    return ForwardingKvKernels::AppendKv(view, pos, n, k, v);
  }
  absl::Status PagedAttention(const PagedKvView& view, const AttentionParams& params, const void* q,
                              void* out) override {
    if (fail_attention) return absl::InternalError("injected PagedAttention failure");
    return ForwardingKvKernels::PagedAttention(view, params, q, out);
  }
  bool fail_append = false;
  bool fail_attention = false;
  bool fail_clear = false;
  bool fail_copy = false;
};

TEST(KvStoreKernelsTest, AKernelFailureGivesBackThePagesItTook) {
  auto kernels = std::make_shared<FaultyKvKernels>();
  StoreOptions o;
  o.arena_bytes = size_t{16} << 20;
  o.default_page_size = 4;
  o.kernels = kernels;
  auto store = *KvStore::Create(o, NewHostBackend());
  ASSERT_TRUE(store->Allocate("", Spec(1, 2, 8), "a").ok());
  std::mt19937 rng(1);
  OwnedTensor k = RandomTensor(rng, DType::kFloat32, 2, 3, 8);
  ASSERT_TRUE(store->Append("", "a", 0, 0, k.Arg(), k.Arg()).ok());
  kernels->fail_append = true;
  OwnedTensor k2 = RandomTensor(rng, DType::kFloat32, 2, 6, 8);
  auto r = store->Append("", "a", 0, 3, k2.Arg(), k2.Arg());
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInternal));
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("injected AppendKv failure"));
  EXPECT_EQ(store->Stats().pages.pages_used, 1);
  EXPECT_EQ(store->Describe("", "a")->info.layer_lens[0], 3);
}

TEST(KvStoreKernelsTest, ACopyFailureLeavesPopnAndForkUndone) {
  auto kernels = std::make_shared<FaultyKvKernels>();
  StoreOptions o;
  o.arena_bytes = size_t{16} << 20;
  o.default_page_size = 4;
  o.kernels = kernels;
  auto store = *KvStore::Create(o, NewHostBackend());
  CacheSpec spec = Spec(2, 2, 8);
  spec.prefix_namespace = "m";
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  ASSERT_TRUE(store->Allocate("", spec, "a", AllocateOptions{prompt}).ok());
  std::mt19937 rng(1);
  OwnedTensor k = RandomTensor(rng, DType::kFloat32, 2, 10, 8);
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(store->Append("", "a", l, 0, k.Arg(), k.Arg()).ok());
  ASSERT_EQ(store->Allocate("", spec, "b", AllocateOptions{prompt})->cached_tokens, 8);
  kernels->fail_copy = true;
  const std::string before = store->TEST_DebugState();
  EXPECT_THAT(store->Popn("", "b", 2), StatusIs(absl::StatusCode::kInternal));  // a copy-on-write
  EXPECT_THAT(store->Fork("", "a", "c"),
              StatusIs(absl::StatusCode::kInternal));  // the partial pages
  EXPECT_EQ(store->TEST_DebugState(), before);
  EXPECT_TRUE(store->TEST_CheckInvariants().ok()) << store->TEST_CheckInvariants();
  kernels->fail_copy = false;
  EXPECT_EQ(store->Popn("", "b", 2)->popped, 2);
  EXPECT_TRUE(store->Fork("", "a", "c").ok());
  EXPECT_TRUE(store->TEST_CheckInvariants().ok()) << store->TEST_CheckInvariants();
}

TEST(KvStoreKernelsTest, AllocateRejectsGeometriesTheKernelsCannotServe) {
  StoreOptions o;
  o.arena_bytes = size_t{16} << 20;
  o.kernels = std::make_shared<FaultyKvKernels>();
  auto store = *KvStore::Create(o, NewHostBackend());
  auto r = store->Allocate("", Spec(1, 2, 96), "a");
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()),
              ::testing::HasSubstr("allocate: spec.head_dim=96"));
  EXPECT_EQ(store->Stats().num_caches, 0);
  EXPECT_EQ(store->Stats().pools.size(), 0u);
}

// A host region whose Commit fails with `failure` on the fail_at-th call (1-based; 0: never).
class FaultyRegion : public Region {
 public:
  FaultyRegion(std::unique_ptr<Region> real, int* calls, int fail_at, absl::Status failure)
      : real_(std::move(real)), calls_(calls), fail_at_(fail_at), failure_(std::move(failure)) {}
  uint8_t* base() const override { return real_->base(); }
  size_t size() const override { return real_->size(); }
  absl::Status Commit(size_t offset, size_t bytes) override {
    if (++*calls_ == fail_at_) return failure_;
    ++committed;
    return real_->Commit(offset, bytes);
  }
  absl::Status Decommit(size_t offset, size_t bytes) override {
    --committed;
    return real_->Decommit(offset, bytes);
  }
  absl::StatusOr<size_t> ResidentBytes() const override { return real_->ResidentBytes(); }
  std::string share_kind() const override { return real_->share_kind(); }
  absl::StatusOr<std::vector<SharedPiece>> ExportPiecesAfter(uint64_t g, size_t first, size_t max,
                                                             size_t* total) const override {
    return real_->ExportPiecesAfter(g, first, max, total);
  }
  int committed = 0;  // chunks committed and not decommitted

 private:
  std::unique_ptr<Region> real_;
  int* const calls_;
  const int fail_at_;
  const absl::Status failure_;
};

class FaultyBackend : public Backend {
 public:
  explicit FaultyBackend(int fail_at,
                         absl::Status failure = absl::InternalError("injected Commit failure"))
      : fail_at_(fail_at), failure_(std::move(failure)) {}
  std::string name() const override { return "faulty"; }
  absl::StatusOr<std::unique_ptr<Region>> Reserve(size_t bytes, const std::string& label) override {
    KVARENA_ASSIGN_OR_RETURN(auto r, real_->Reserve(bytes, label));
    auto region = std::make_unique<FaultyRegion>(std::move(r), &calls_, fail_at_, failure_);
    last = region.get();
    return region;
  }
  FaultyRegion* last = nullptr;

 private:
  std::unique_ptr<Backend> real_ = NewHostBackend();
  int calls_ = 0;
  const int fail_at_;
  const absl::Status failure_;
};

StoreOptions SmallArena(std::shared_ptr<KvKernels> kernels) {
  StoreOptions o;
  o.arena_bytes = size_t{16} << 20;
  o.default_page_size = 4;
  o.kernels = std::move(kernels);
  return o;
}

TEST(KvStoreKernelsTest, AttendWithKvKeepsNothingWhenTheKernelFails) {
  auto kernels = std::make_shared<FaultyKvKernels>();
  auto store = *KvStore::Create(SmallArena(kernels), NewHostBackend());
  ASSERT_TRUE(store->Allocate("", Spec(1, 2, 8, DType::kFloat32, {2}), "a").ok());
  std::mt19937 rng(1);
  OwnedTensor k = RandomTensor(rng, DType::kFloat32, 2, 4, 8);
  ASSERT_TRUE(store->Append("", "a", 0, 0, k.Arg(), k.Arg()).ok());
  const CacheDescription before = *store->Describe("", "a");
  const ArenaStats stats = store->Stats();
  kernels->fail_attention = true;
  OwnedTensor q = RandomTensor(rng, DType::kFloat32, 2, 3, 8);
  OwnedTensor k2 = RandomTensor(rng, DType::kFloat32, 2, 3, 8);
  std::vector<uint8_t> out(q.bytes.size());
  AttendArgs a;
  a.cache_id = "a";
  a.pos = 4;
  a.q = q.Arg();
  a.k = k2.Arg();
  a.v = k2.Arg();
  EXPECT_THAT(store->Attend("", a, out.data(), out.size()), StatusIs(absl::StatusCode::kInternal));
  const CacheDescription after = *store->Describe("", "a");
  EXPECT_EQ(after.info.layer_lens, before.info.layer_lens);
  EXPECT_EQ(after.layers[0].page_ids, before.layers[0].page_ids);  // nothing evicted either
  EXPECT_EQ(store->Stats().pages.pages_used, stats.pages.pages_used);
  EXPECT_EQ(store->Stats().pages.seq_len, stats.pages.seq_len);
  EXPECT_TRUE(store->TEST_CheckInvariants().ok());
}

TEST(KvStoreKernelsTest, ReserveGivesEverythingBackWhenClearingFails) {
  auto kernels = std::make_shared<FaultyKvKernels>();
  auto store = *KvStore::Create(SmallArena(kernels), NewHostBackend());
  ASSERT_TRUE(store->Allocate("", Spec(2, 2, 8), "a").ok());
  kernels->fail_clear = true;
  EXPECT_THAT(store->Reserve("", {{"a", 9}}), StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(store->Stats().pages.pages_used, 0);
  EXPECT_EQ(store->Describe("", "a")->layers[0].page_ids.size(), 0u);
  EXPECT_TRUE(store->TEST_CheckInvariants().ok());
  kernels->fail_clear = false;
  EXPECT_TRUE(store->Reserve("", {{"a", 9}}).ok());
}

// One Append needing three chunks, the second of whose commits fails: the first is
// decommitted again and the whole budget is refunded.
TEST(KvStoreKernelsTest, AFailedChunkCommitLeavesNothingCommitted) {
  auto backend = std::make_unique<FaultyBackend>(/*fail_at=*/2);
  FaultyBackend* faulty = backend.get();
  StoreOptions o = SmallArena(nullptr);
  o.empty_chunks_kept = 0;
  auto store = *KvStore::Create(o, std::move(backend));
  // 1 kv head x 128 dims x f32 x page 4: 4 KiB pages, 512 per 2 MiB chunk.
  ASSERT_TRUE(store->Allocate("", Spec(1, 1, 128), "a").ok());
  std::mt19937 rng(2);
  const int64_t tokens = 4 * 512 * 2 + 4;  // two chunks and one page
  OwnedTensor k = RandomTensor(rng, DType::kFloat32, 1, tokens, 128);
  auto r = store->Append("", "a", 0, 0, k.Arg(), k.Arg());
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInternal));
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("injected Commit failure"));
  EXPECT_EQ(store->Stats().bytes_committed, 0u);
  EXPECT_EQ(faulty->last->committed, 0);
  EXPECT_EQ(store->Stats().pools[0].chunks_committed, 0);
  ASSERT_TRUE(store->Append("", "a", 0, 0, k.Arg(), k.Arg()).ok());  // the fault was one-off
  EXPECT_EQ(store->Stats().pools[0].chunks_committed, 3);
}

// The device out of memory (what the CUDA backend's Commit says when cuMemCreate fails)
// is a refusal of its own, not the arena budget's.
TEST(KvStoreKernelsTest, ABackendOutOfMemoryIsRefusedAsDeviceMemory) {
  StoreOptions o = SmallArena(nullptr);
  auto backend = std::make_unique<FaultyBackend>(
      /*fail_at=*/1, absl::ResourceExhaustedError("cuMemCreate: out of memory"));
  auto store = *KvStore::Create(o, std::move(backend));
  ASSERT_TRUE(store->Allocate("", Spec(1, 1, 128), "a").ok());
  std::mt19937 rng(3);
  OwnedTensor k = RandomTensor(rng, DType::kFloat32, 1, 4, 128);
  const absl::Status s = store->Append("", "a", 0, 0, k.Arg(), k.Arg()).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("cuMemCreate: out of memory"));
  EXPECT_EQ(RefusalOf(s), Refusal::kDeviceMemory);
}

}  // namespace
}  // namespace kvarena
