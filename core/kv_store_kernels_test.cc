// KvStore over a KvKernels fault injector: what core does when the backend's kernels
// refuse a geometry or fail on the device.
#include "core/store_fixture.h"

namespace kvarena {
namespace {

// Wraps the real CPU kernels and fails the calls it is told to (a device error).
class FaultyKvKernels : public KvKernels {
 public:
  std::string name() const override { return "faulty"; }
  absl::Status CheckLayout(const PageLayout& layout) const override {
    if (layout.head_dim == 96) return absl::InvalidArgumentError("spec.head_dim=96 is not served");
    return absl::OkStatus();
  }
  absl::Status ClearPages(const PageLayout& layout, uint8_t* pool_base, const int32_t* ids,
                          int64_t n) override {
    return real_->ClearPages(layout, pool_base, ids, n);
  }
  absl::Status AppendKv(const PagedKvView& view, int64_t pos, int64_t n, const void* k,
                        const void* v) override {
    if (fail_append) return absl::InternalError("injected AppendKv failure");
    return real_->AppendKv(view, pos, n, k, v);
  }
  absl::Status GatherKv(const PagedKvView& view, int64_t pos, int64_t n, void* k_out,
                        void* v_out) override {
    return real_->GatherKv(view, pos, n, k_out, v_out);
  }
  absl::Status PagedAttention(const PagedKvView& view, const AttentionParams& params,
                              const void* q, void* out) override {
    return real_->PagedAttention(view, params, q, out);
  }
  bool fail_append = false;

 private:
  std::unique_ptr<KvKernels> real_ = NewCpuKvKernels(0);
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

TEST(KvStoreKernelsTest, AllocateRejectsGeometriesTheKernelsCannotServe) {
  StoreOptions o;
  o.arena_bytes = size_t{16} << 20;
  o.kernels = std::make_shared<FaultyKvKernels>();
  auto store = *KvStore::Create(o, NewHostBackend());
  auto r = store->Allocate("", Spec(1, 2, 96), "a");
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("allocate: spec.head_dim=96"));
  EXPECT_EQ(store->Stats().num_caches, 0);
  EXPECT_EQ(store->Stats().pools.size(), 0u);
}

}  // namespace
}  // namespace kvarena
