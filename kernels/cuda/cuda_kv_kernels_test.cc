// NewCudaKvKernels against NewCpuKvKernels through core's KvKernels interface: host
// tensors in and out, the pool on the device, the block table on the host (the adapter
// stages it). Skips without a CUDA device, except the test of that case.
#include "kernels/cuda/cuda_kv_kernels.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/quant_test_problems.h"
#include "kernels/cuda/test_problems.h"
#include "kernels/kv_kernels.h"
#include "tests/support/test_seed.h"

namespace kvarena {
namespace {

using gpu::testing::CompareOutputs;
using gpu::testing::HostBatch;
using gpu::testing::ParamsFor;
using gpu::testing::Problem;
using gpu::testing::RandomStored;
using gpu::testing::SeqSpec;

bool GpuPresent() {
  int n = 0;
  const bool present = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return present;
}

TEST(CudaKvKernelsTest, CheckLayoutTakesTheHeadDimsTheKernelsServe) {
  absl::StatusOr<std::unique_ptr<KvKernels>> made = NewCudaKvKernels(0);
  if (!made.ok()) GTEST_SKIP() << "no CUDA device: " << made.status();
  KvKernels* k = made->get();
  for (int head_dim : {64, 128, 256}) {
    EXPECT_TRUE(k->CheckLayout(PageLayout{DType::kBFloat16, 16, 8, head_dim}).ok()) << head_dim;
  }
  for (KvFormat f : {KvFormat::kInt8, KvFormat::kFp8E4M3}) {
    for (int kv_heads : {1, 3, 8}) {
      EXPECT_TRUE(k->CheckLayout(PageLayout{DType::kFloat16, 16, kv_heads, 128, f}).ok())
          << KvFormatName(f) << " " << kv_heads;
    }
  }
  const absl::Status s = k->CheckLayout(PageLayout{DType::kFloat16, 16, 8, 96});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("spec.head_dim=96"), absl::string_view::npos) << s;
}

TEST(CudaKvKernelsTest, WithoutDeviceFailsCleanly) {
  if (GpuPresent()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(NewCudaKvKernels(0).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CudaKvKernelsTest, CopyPagesMatchesCpuKvKernels) {
  if (!GpuPresent()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(kvarena::testing::TestSeed());
  auto cuda = NewCudaKvKernels(0);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  std::unique_ptr<KvKernels> cpu = NewCpuKvKernels(0);
  const PageLayout layout{DType::kBFloat16, 16, 2, 128};
  const size_t page = layout.PageBytes();
  std::vector<uint8_t> host = RandomStored(layout.dtype, 6 * page / 2, rng);
  void* dpool = nullptr;
  ASSERT_EQ(cudaMalloc(&dpool, host.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dpool, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  const PageCopy copies[] = {{0, 3, 5}, {1, 4, 16}, {2, 5, 0}};
  ASSERT_TRUE(cpu->CopyPages(layout, host.data(), copies, 3).ok());
  ASSERT_TRUE((*cuda)->CopyPages(layout, static_cast<uint8_t*>(dpool), copies, 3).ok());
  std::vector<uint8_t> back(host.size());
  ASSERT_EQ(cudaMemcpy(back.data(), dpool, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dpool);
  EXPECT_TRUE(back == host);
}

TEST(CudaKvKernelsTest, MatchesCpuKvKernels) {
  if (!GpuPresent()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = kvarena::testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  auto cuda = NewCudaKvKernels(0);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(NewCudaKvKernels(-1).status().code(), absl::StatusCode::kInvalidArgument);
  std::unique_ptr<KvKernels> cpu = NewCpuKvKernels(0);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t n : {int64_t(1), int64_t(7)}) {
      Problem pb;
      pb.layout = PageLayout{dtype, 16, 2, 128};
      pb.group = 4;
      pb.n = n;
      pb.window = n == 1 ? 0 : 9;
      pb.seqs = {SeqSpec{1, int64_t(100 + rng() % 300), 0}};
      pb.seqs[0].len = pb.seqs[0].pos;  // the n new tokens are appended first
      SCOPED_TRACE(pb.Describe());
      HostBatch hb(pb, rng);
      hb.FillRandom(rng);
      const int64_t pos = pb.seqs[0].pos;
      const size_t kv_bytes = size_t(2) * n * 128 * pb.layout.ElemBytes();
      const std::vector<uint8_t> k = RandomStored(dtype, kv_bytes / pb.layout.ElemBytes(), rng);
      const std::vector<uint8_t> v = RandomStored(dtype, kv_bytes / pb.layout.ElemBytes(), rng);

      void* dpool = nullptr;
      ASSERT_EQ(cudaMalloc(&dpool, hb.pool().size()), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dpool, hb.pool().data(), hb.pool().size(), cudaMemcpyHostToDevice),
                cudaSuccess);
      PagedKvView host_view = hb.View(0);
      host_view.len = pos + n;
      PagedKvView dev_view = host_view;
      dev_view.pool_base = static_cast<uint8_t*>(dpool);

      ASSERT_TRUE(cpu->AppendKv(host_view, pos, n, k.data(), v.data()).ok());
      ASSERT_TRUE((*cuda)->AppendKv(dev_view, pos, n, k.data(), v.data()).ok());
      std::vector<uint8_t> pool_back(hb.pool().size());
      ASSERT_EQ(cudaMemcpy(pool_back.data(), dpool, pool_back.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_TRUE(pool_back == hb.pool()) << "append";

      std::vector<uint8_t> k_out(kv_bytes, 0xFF), v_out(kv_bytes, 0xFF);
      ASSERT_TRUE((*cuda)->GatherKv(dev_view, pos, n, k_out.data(), v_out.data()).ok());
      EXPECT_TRUE(k_out == k && v_out == v) << "gather";

      const AttentionParams p = ParamsFor(pb, pos);
      const size_t q_bytes = size_t(pb.num_q_heads()) * n * 128 * pb.layout.ElemBytes();
      const std::vector<uint8_t> q = RandomStored(dtype, q_bytes / pb.layout.ElemBytes(), rng);
      std::vector<uint8_t> want(q_bytes), got(q_bytes, 0xFF);
      ASSERT_TRUE(cpu->PagedAttention(host_view, p, q.data(), want.data()).ok());
      ASSERT_TRUE((*cuda)->PagedAttention(dev_view, p, q.data(), got.data()).ok());
      EXPECT_EQ(CompareOutputs(dtype, got, want, 128), "") << "attention";
      cudaFree(dpool);
    }
  }
}

// The quantized formats through the adapter: host k / v / q and host static scales
// (staged by the adapter), pages on the device; pages byte for byte, gather as the CPU's,
// attention within float32 rounding of the CPU kernel's float path (below its VNNI tile).
TEST(CudaKvKernelsTest, QuantizedMatchesCpuKvKernels) {
  if (!GpuPresent()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = kvarena::testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  auto cuda = NewCudaKvKernels(0);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  std::unique_ptr<KvKernels> cpu = NewCpuKvKernels(0);
  for (KvFormat format : {KvFormat::kInt8, KvFormat::kFp8E4M3}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      Problem pb;
      pb.layout = PageLayout{dtype, 16, 3, 128, format};  // 3 heads: misaligned int8 rows
      pb.group = 4;
      pb.n = 5;
      pb.window = 40;
      pb.seqs = {SeqSpec{1, int64_t(100 + rng() % 300), 0}};
      pb.seqs[0].len = pb.seqs[0].pos;
      SCOPED_TRACE(pb.Describe() + " " + KvFormatName(format));
      HostBatch hb(pb, rng);
      gpu::testing::SetRandomStaticScales(pb, hb, rng);
      gpu::testing::FillByCpuAppend(pb, hb, rng);
      const int64_t pos = pb.seqs[0].pos, n = pb.n;
      const size_t count = size_t(3) * n * 128, bytes = count * pb.layout.ActivationBytes();
      const std::vector<uint8_t> k = gpu::testing::RandomActivations(dtype, count, rng, 0.05);
      const std::vector<uint8_t> v = gpu::testing::RandomActivations(dtype, count, rng, 0.05);

      void* dpool = nullptr;
      ASSERT_EQ(cudaMalloc(&dpool, hb.pool().size()), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dpool, hb.pool().data(), hb.pool().size(), cudaMemcpyHostToDevice),
                cudaSuccess);
      PagedKvView host_view = hb.View(0);
      host_view.len = pos + n;
      PagedKvView dev_view = host_view;  // static scales stay host arrays: the adapter stages
      dev_view.pool_base = static_cast<uint8_t*>(dpool);
      ASSERT_TRUE(cpu->AppendKv(host_view, pos, n, k.data(), v.data()).ok());
      ASSERT_TRUE((*cuda)->AppendKv(dev_view, pos, n, k.data(), v.data()).ok());
      std::vector<uint8_t> pool_back(hb.pool().size());
      ASSERT_EQ(cudaMemcpy(pool_back.data(), dpool, pool_back.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_TRUE(pool_back == hb.pool()) << "append";

      std::vector<uint8_t> want_k(bytes), want_v(bytes), k_out(bytes, 0xFF), v_out(bytes, 0xFF);
      ASSERT_TRUE(cpu->GatherKv(host_view, pos, n, want_k.data(), want_v.data()).ok());
      ASSERT_TRUE((*cuda)->GatherKv(dev_view, pos, n, k_out.data(), v_out.data()).ok());
      EXPECT_TRUE(k_out == want_k && v_out == want_v) << "gather";

      const AttentionParams p = ParamsFor(pb, pos);
      const size_t q_count = size_t(pb.num_q_heads()) * n * 128;
      const std::vector<uint8_t> q = RandomStored(dtype, q_count, rng);
      std::vector<uint8_t> want(q_count * pb.layout.ActivationBytes());
      std::vector<uint8_t> got(want.size(), 0xFF);
      TEST_ForceCpuKernels(CpuKernels::kAvx512);
      ASSERT_TRUE(cpu->PagedAttention(host_view, p, q.data(), want.data()).ok());
      TEST_ForceCpuKernels(CpuKernels::kAvx512Bf16);
      ASSERT_TRUE((*cuda)->PagedAttention(dev_view, p, q.data(), got.data()).ok());
      EXPECT_EQ(
          gpu::testing::CompareWithin(dtype, got, gpu::testing::DecodeAll(dtype, want), 5e-5, 1e-5),
          "")
          << "attention";
      cudaFree(dpool);
    }
  }
}

}  // namespace
}  // namespace kvarena
