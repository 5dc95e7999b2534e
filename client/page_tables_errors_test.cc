// local_table and the batch page tables (kvarena/page_tables.h) at their edges: what the
// handle's own table says with no RPC, what the builders refuse, the vLLM row width and
// pad, and the device copies (a GPU test: skipped without a device).
#include <cstdint>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvarena/client.h"
#include "kvarena/page_tables.h"
#include "tests/support/inproc_fixture.h"
#include "tests/support/kv_history.h"
#include "tests/support/status_matchers.h"
#if defined(KVARENA_CLIENT_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace kvarena {
namespace {

using testing::HostTensor;
using testing::IsOk;
using testing::StatusIs;

constexpr int kPageSize = 4;

class PageTableEdgesTest : public testing::InprocClientFixture<> {
 protected:
  PageTableEdgesTest() : InprocClientFixture(testing::InprocOptions(1, size_t{32} << 20)) {}

  std::shared_ptr<GenericKvCacheHandle> Allocate(int head_dim = 8) {
    return NewCache(testing::MakeSpec(2, 1, head_dim, DType::kFloat32, kPageSize));
  }
  // n tokens on every layer through the local path.
  void Fill(GenericKvCacheHandle& h, int64_t n) {
    ASSERT_THAT(h.reserve(n), IsOk());
    for (int layer = 0; layer < h.num_layers(); ++layer) Write(h, layer, n);
    ASSERT_THAT(h.commit(n), IsOk());
  }
  void Write(GenericKvCacheHandle& h, int layer, int64_t n) {
    HostTensor k = testing::RandomTensor(rng_, h.dtype(), 1, n, h.head_dim());
    ASSERT_THAT(h.append_local(layer, k.arg(), k.arg()), IsOk());
  }

  std::mt19937_64 rng_{11};
};

TEST_F(PageTableEdgesTest, LocalTableFollowsReserveWritesAndCommitWithoutRpc) {
  auto h = Allocate();
  const CallCounts before = client_->call_counts();
  auto t = h->local_table(0);
  ASSERT_THAT(t, IsOk());
  EXPECT_TRUE(t->page_ids.empty());
  EXPECT_EQ(t->end(kPageSize), 0);
  ASSERT_THAT(h->reserve(1), IsOk());
  Write(*h, 0, 1);
  t = h->local_table(0);
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->page_ids.size(), 1u);
  EXPECT_EQ(t->len, 0);
  EXPECT_EQ(t->written, 1);  // written locally, not committed
  EXPECT_EQ(t->end(kPageSize), kPageSize);
  EXPECT_EQ(h->local_table(1)->written, 0);
  Write(*h, 1, 1);
  ASSERT_THAT(h->commit(1), IsOk());
  EXPECT_EQ(h->local_table(1)->len, 1);
  EXPECT_EQ(client_->call_counts().describe, before.describe);
  EXPECT_THAT(h->local_table(2), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(PageTableEdgesTest, LocalTableReloadsAfterPopnAndAgreesWithDescribe) {
  auto h = Allocate();
  Fill(*h, 10);
  ASSERT_EQ(h->popn(3)->popped, 3);
  auto d = h->describe();
  ASSERT_THAT(d, IsOk());
  auto t = h->local_table(0);
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->page_ids, d->layers[0].page_ids);
  EXPECT_EQ(t->first_pos, d->layers[0].first_pos);
  EXPECT_EQ(t->len, 7);
  auto narrow = h->with_sequence_length(2);
  ASSERT_THAT(narrow, IsOk());
  auto seen = (*narrow)->local_table(0);
  ASSERT_THAT(seen, IsOk());
  EXPECT_EQ(seen->len, 2);
  EXPECT_EQ(seen->written, 2);
  EXPECT_EQ(seen->page_ids.size(), 1u);  // the pages of its 2 tokens only
  // A view reads through the tables, but may not write.
  auto fi = BuildFlashInferPageTable({{*narrow, 0}}, 0);
  ASSERT_THAT(fi, IsOk());
  EXPECT_EQ(fi->last_page_len, (std::vector<int32_t>{2}));
  EXPECT_THAT(BuildFlashInferPageTable({{*narrow, 1}}, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(PageTableEdgesTest, BuildersRefuseWhatTheyCannotExpress) {
  auto a = Allocate(), b = Allocate(), other_pool = Allocate(/*head_dim=*/16);
  Fill(*a, 4);
  Fill(*b, 5);
  Fill(*other_pool, 1);
  EXPECT_THAT(BuildFlashInferPageTable({}, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(BuildFlashInferPageTable({{a, 0}, {nullptr, 0}}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(BuildVllmBlockTables({{a, -1}}, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(BuildVllmBlockTables({{a, 0}}, 2), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(BuildFlashInferPageTable({{a, 0}, {other_pool, 0}}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto other_client = Client::Connect("inproc:");
  ASSERT_THAT(other_client, IsOk());
  auto stranger = (*other_client)->Allocate(a->describe()->info.spec);
  ASSERT_THAT(stranger, IsOk());
  EXPECT_THAT(BuildFlashInferPageTable({{a, 0}, {*stranger, 0}}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // a's 4 tokens fill its one page: a new token needs a reserve; b has room in its page.
  EXPECT_THAT(BuildVllmBlockTables({{b, 1}, {a, 1}}, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(BuildVllmBlockTables({{b, 3}}, 0), IsOk());
  EXPECT_THAT(BuildVllmBlockTables({{b, 4}}, 0), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(BuildVllmBlockTables({{b, INT64_MAX}}, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(BuildVllmBlockTables({{a, 0}, {b, 0}}, 0, /*max_blocks=*/1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(BuildVllmBlockTables({{a, 0}}, 0, /*max_blocks=*/-1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(a->release(), IsOk());
  EXPECT_THAT(BuildFlashInferPageTable({{a, 0}}, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(PageTableEdgesTest, VllmRowsHaveTheAskedWidthAndPad) {
  auto a = Allocate(), b = Allocate(), empty = Allocate();
  Fill(*a, 4);
  Fill(*b, 9);
  auto ta = a->local_table(1), tb = b->local_table(1);
  ASSERT_THAT(ta, IsOk());
  ASSERT_THAT(tb, IsOk());
  auto v = BuildVllmBlockTables({{a, 0}, {b, 0}, {empty, 0}}, 1, /*max_blocks=*/4, /*pad=*/0);
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(v->max_blocks, 4);
  const std::vector<int32_t> want = {
      ta->page_ids[0], 0, 0, 0, tb->page_ids[0], tb->page_ids[1], tb->page_ids[2], 0, 0, 0, 0, 0};
  EXPECT_EQ(v->block_tables, want);
  EXPECT_EQ(v->seq_lens, (std::vector<int32_t>{4, 9, 0}));
  auto fi = BuildFlashInferPageTable({{a, 0}, {b, 0}, {empty, 0}}, 1);
  ASSERT_THAT(fi, IsOk());
  EXPECT_EQ(fi->indptr, (std::vector<int32_t>{0, 1, 4, 4}));
  EXPECT_EQ(fi->last_page_len, (std::vector<int32_t>{4, 1, 0}));  // a full page, one token, none
}

TEST_F(PageTableEdgesTest, CopyToDeviceFillsTheCallersBuffers) {
  auto a = Allocate(), b = Allocate();
  Fill(*a, 6);
  Fill(*b, 3);
  ASSERT_THAT(client_->Reserve({{a, 1}, {b, 2}}), IsOk());
  auto fi = BuildFlashInferPageTable({{a, 1}, {b, 2}}, 0);
  auto v = BuildVllmBlockTables({{a, 1}, {b, 2}}, 0);
  ASSERT_THAT(fi, IsOk());
  ASSERT_THAT(v, IsOk());
#if defined(KVARENA_CLIENT_CUDA)
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    EXPECT_THAT(CopyToDevice(*fi, FlashInferDeviceTable{}, nullptr),
                StatusIs(absl::StatusCode::kFailedPrecondition));
    GTEST_SKIP() << "no CUDA device";
  }
  constexpr int64_t kCap = 64;
  int32_t* dev32 = nullptr;  // [7][kCap]: every int32 array of both tables
  int64_t* slots = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev32), 7 * kCap * sizeof(int32_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&slots), kCap * sizeof(int64_t)), cudaSuccess);
  auto buf = [&](int i) { return DeviceBuffer<int32_t>{dev32 + i * kCap, kCap}; };
  const FlashInferDeviceTable fd{buf(0), buf(1), buf(2)};
  const VllmDeviceTables vd{buf(3), buf(4), buf(5), DeviceBuffer<int64_t>{slots, kCap}};
  EXPECT_THAT(CopyToDevice(*fi, fd, nullptr), IsOk());
  EXPECT_THAT(CopyToDevice(*v, vd, nullptr), IsOk());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto back = [&](const int32_t* dev, size_t n) {
    std::vector<int32_t> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), dev, n * sizeof(int32_t), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  };
  EXPECT_EQ(back(fd.indptr.data, fi->indptr.size()), fi->indptr);
  EXPECT_EQ(back(fd.indices.data, fi->indices.size()), fi->indices);
  EXPECT_EQ(back(fd.last_page_len.data, fi->last_page_len.size()), fi->last_page_len);
  EXPECT_EQ(back(vd.block_tables.data, v->block_tables.size()), v->block_tables);
  EXPECT_EQ(back(vd.seq_lens.data, v->seq_lens.size()), v->seq_lens);
  EXPECT_EQ(back(vd.query_start_loc.data, v->query_start_loc.size()), v->query_start_loc);
  std::vector<int64_t> got(v->slot_mapping.size());
  ASSERT_EQ(cudaMemcpy(got.data(), slots, got.size() * sizeof(int64_t), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got, v->slot_mapping);
  FlashInferDeviceTable small = fd;
  small.indices.capacity = int64_t(fi->indices.size()) - 1;
  EXPECT_THAT(CopyToDevice(*fi, small, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<int32_t> host(kCap);
  FlashInferDeviceTable on_host = fd;
  on_host.indptr.data = host.data();
  EXPECT_THAT(CopyToDevice(*fi, on_host, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  cudaFree(dev32);
  cudaFree(slots);
#else
  EXPECT_THAT(CopyToDevice(*fi, FlashInferDeviceTable{}, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(CopyToDevice(*v, VllmDeviceTables{}, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  GTEST_SKIP() << "client built without CUDA";
#endif
}

}  // namespace
}  // namespace kvarena
