// The CUDA kernels on a real device against the CPU kernels: fresh random inputs, pool and
// block tables on the device, outputs poisoned (0xFF = NaN) with a guard band first.
// Every test skips when no CUDA device is usable; nothing touches CUDA before a test
// body runs, so listing the tests (gtest_discover_tests) works on any machine.
#include "kernels/cuda/kv_kernels_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/kv_kernels.h"
#include "kernels/cuda/gpu_test_util.h"
#include "kernels/cuda/test_problems.h"
#include "tests/support/test_seed.h"

namespace kvarena::gpu {
namespace {

using testing::CompareOutputs;
using testing::CpuAttention;
using testing::DeviceBatch;
using testing::DeviceBuffer;
using testing::GpuPresent;
using testing::HostBatch;
using testing::ParamsFor;
using testing::Problem;
using testing::RandomStored;
using testing::SeqSpec;

class KvKernelsCudaTest : public ::testing::Test {
 protected:
  KvKernelsCudaTest() : seed_(kvarena::testing::TestSeed()), rng_(seed_) {}

  int64_t Rand(int64_t lo, int64_t hi) { return lo + int64_t(rng_() % uint64_t(hi - lo + 1)); }

  // Runs pb batched and per sequence on the device; both must match the CPU kernel.
  void CheckAttention(const Problem& pb) {
    SCOPED_TRACE(pb.Describe());
    HostBatch hb(pb, rng_);
    hb.FillRandom(rng_);
    const size_t per_seq = size_t(pb.num_q_heads()) * pb.n * pb.layout.head_dim;
    const size_t seq_bytes = per_seq * pb.layout.ElemBytes();
    const std::vector<uint8_t> q = RandomStored(pb.layout.dtype, per_seq * hb.batch(), rng_);
    const std::vector<uint8_t> want = CpuAttention(pb, hb, q);
    DeviceBatch db(hb);
    DeviceBuffer dq(q.data(), q.size());

    int64_t span = 1;
    for (int b = 0; b < hb.batch(); ++b) {
      const int64_t lo =
          std::max(hb.View(b).first_pos(), pb.window > 0 ? pb.seqs[b].pos - pb.window + 1 : 0);
      span = std::max(span, pb.seqs[b].pos + pb.n - lo);
    }
    const PagedKvBatch batch = db.Batch(pb.layout, hb.batch(), span);
    const AttentionParams params = ParamsFor(pb, 0);
    size_t ws_bytes = 0;
    ASSERT_EQ(PagedAttentionBatchWorkspaceSize(batch, params, &ws_bytes), cudaSuccess);
    DeviceBuffer ws(ws_bytes);
    DeviceBuffer out(want.size() + 64);
    ASSERT_EQ(cudaMemset(out.get(), 0xFF, want.size() + 64), cudaSuccess);
    ASSERT_EQ(PagedAttentionBatch(batch, params, dq.get(), out.get(), ws.get(), ws_bytes),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> got = out.Read(want.size() + 64);
    EXPECT_TRUE(std::all_of(got.begin() + want.size(), got.end(), [](uint8_t x) {
      return x == 0xFF;
    })) << "wrote past the output";
    got.resize(want.size());
    EXPECT_EQ(CompareOutputs(pb.layout.dtype, got, want, pb.layout.head_dim), "") << "batched";

    for (int b = 0; b < hb.batch(); ++b) {
      const PagedKvView view = db.View(hb, b);
      const AttentionParams p = ParamsFor(pb, pb.seqs[b].pos);
      ASSERT_EQ(PagedAttentionWorkspaceSize(view, p, &ws_bytes), cudaSuccess);
      DeviceBuffer ws1(ws_bytes);
      DeviceBuffer out1(seq_bytes);
      ASSERT_EQ(cudaMemset(out1.get(), 0xFF, seq_bytes), cudaSuccess);
      ASSERT_EQ(PagedAttention(view, p, dq.get<uint8_t>() + b * seq_bytes, out1.get(), ws1.get(),
                               ws_bytes),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<uint8_t> want_b(want.begin() + b * seq_bytes,
                                        want.begin() + (b + 1) * seq_bytes);
      EXPECT_EQ(CompareOutputs(pb.layout.dtype, out1.Read(seq_bytes), want_b, pb.layout.head_dim),
                "")
          << "sequence " << b;
    }
  }

  void Sweep(DType dtype, bool long_context) {
    SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
    for (const Problem& pb : testing::AttentionSweep(dtype, rng_, long_context)) {
      CheckAttention(pb);
      if (HasFailure()) return;  // one broken config is enough to read
    }
  }

  uint64_t seed_;
  std::mt19937_64 rng_;
};

TEST_F(KvKernelsCudaTest, AppendMatchesCpuByteForByteAndGatherReadsItBack) {
  SKIP_WITHOUT_GPU();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int head_dim : {36, 64, 128, 256}) {
      for (int page_size : {1, 3, 16, 64}) {
        Problem pb;
        pb.layout = PageLayout{dtype, page_size, 2, head_dim};
        pb.n = Rand(1, 40);
        for (int b = 0, batch = int(Rand(1, 4)); b < batch; ++b) {
          SeqSpec s;
          s.pos = Rand(0, 100);
          if (s.pos >= page_size && Rand(0, 1)) s.first_block = Rand(1, s.pos / page_size);
          s.len = s.pos;
          pb.seqs.push_back(s);
        }
        SCOPED_TRACE(pb.Describe());
        HostBatch hb(pb, rng_);
        const size_t seq_bytes =
            size_t(pb.layout.num_kv_heads) * pb.n * head_dim * pb.layout.ElemBytes();
        const std::vector<uint8_t> k =
            RandomStored(dtype, seq_bytes / pb.layout.ElemBytes() * hb.batch(), rng_);
        const std::vector<uint8_t> v =
            RandomStored(dtype, seq_bytes / pb.layout.ElemBytes() * hb.batch(), rng_);
        DeviceBatch single(hb), batched(hb);  // both start as the 0xFF pool
        DeviceBuffer dk(k.data(), k.size()), dv(v.data(), v.size());
        for (int b = 0; b < hb.batch(); ++b) {
          ::kvarena::AppendKv(hb.View(b), pb.seqs[b].pos, pb.n, k.data() + b * seq_bytes,
                              v.data() + b * seq_bytes);
          ASSERT_EQ(
              gpu::AppendKv(single.View(hb, b), pb.seqs[b].pos, pb.n,
                            dk.get<uint8_t>() + b * seq_bytes, dv.get<uint8_t>() + b * seq_bytes),
              cudaSuccess);
        }
        ASSERT_EQ(AppendKvBatch(batched.Batch(pb.layout, hb.batch(), 0), pb.n, dk.get(), dv.get()),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_TRUE(single.pool.Read(hb.pool().size()) == hb.pool()) << "single";
        EXPECT_TRUE(batched.pool.Read(hb.pool().size()) == hb.pool()) << "batched";
        for (int b = 0; b < hb.batch(); ++b) {  // and gather reads them back
          DeviceBuffer gk(seq_bytes + 16), gv(seq_bytes);
          ASSERT_EQ(cudaMemset(gk.get(), 0xFF, seq_bytes + 16), cudaSuccess);
          ASSERT_EQ(gpu::GatherKv(single.View(hb, b), pb.seqs[b].pos, pb.n, gk.get(), gv.get()),
                    cudaSuccess);
          const std::vector<uint8_t> got_k = gk.Read(seq_bytes + 16), got_v = gv.Read(seq_bytes);
          EXPECT_TRUE(
              std::equal(got_k.begin(), got_k.begin() + seq_bytes, k.begin() + b * seq_bytes));
          EXPECT_TRUE(std::equal(got_v.begin(), got_v.end(), v.begin() + b * seq_bytes));
          EXPECT_EQ(got_k[seq_bytes], 0xFF) << "gather wrote past its output";
        }
        if (HasFailure()) return;
      }
    }
  }
}

TEST_F(KvKernelsCudaTest, Float32AttentionMatchesCpuAcrossSweep) {
  SKIP_WITHOUT_GPU();
  Sweep(DType::kFloat32, false);
}
TEST_F(KvKernelsCudaTest, Float16AttentionMatchesCpuAcrossSweep) {
  SKIP_WITHOUT_GPU();
  Sweep(DType::kFloat16, false);
}
TEST_F(KvKernelsCudaTest, BFloat16AttentionMatchesCpuAcrossSweep) {
  SKIP_WITHOUT_GPU();
  Sweep(DType::kBFloat16, false);
}
TEST_F(KvKernelsCudaTest, LongContextsSplitAndMatchCpu) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) Sweep(dtype, true);
}

// The benchmark's shape (GQA 4, head_dim 128, page 16, bf16) at batch 1 / 16 / 64 with
// contexts of different lengths (2k-4k; 1k-2k at batch 64), with and without a window.
TEST_F(KvKernelsCudaTest, BatchedDecodeAtBenchmarkShapes) {
  SKIP_WITHOUT_GPU();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (int batch : {1, 16, 64}) {
    for (int64_t window : {int64_t(0), int64_t(1000)}) {
      Problem pb;
      pb.layout = PageLayout{DType::kBFloat16, 16, 8, 128};
      pb.group = 4;
      pb.window = window;
      for (int b = 0; b < batch; ++b) {
        const int64_t pos = batch == 64 ? Rand(1000, 2000) : Rand(2000, 4096);
        pb.seqs.push_back(SeqSpec{0, pos, pos + 1});
      }
      CheckAttention(pb);
      if (HasFailure()) return;
    }
  }
}

TEST_F(KvKernelsCudaTest, RejectsUnsupportedShapesWithInvalidValue) {
  SKIP_WITHOUT_GPU();
  PagedKvView view;
  view.layout = PageLayout{DType::kBFloat16, 16, 2, 96};  // head_dim 96: not instantiated
  AttentionParams p;
  p.num_q_heads = 4;
  p.scale = 0.1f;
  size_t bytes = 1;
  EXPECT_EQ(PagedAttentionWorkspaceSize(view, p, &bytes), cudaErrorInvalidValue);
  view.layout.head_dim = 128;
  view.layout.dtype = DType::kUnspecified;
  EXPECT_EQ(PagedAttentionWorkspaceSize(view, p, &bytes), cudaErrorInvalidValue);
  view.layout.dtype = DType::kFloat16;
  p.num_q_heads = 3;
  EXPECT_EQ(PagedAttentionWorkspaceSize(view, p, &bytes), cudaErrorInvalidValue);
  p.num_q_heads = 4;
  EXPECT_EQ(PagedAttentionWorkspaceSize(view, p, &bytes), cudaSuccess);
  EXPECT_EQ(PagedAttention(view, p, nullptr, nullptr, nullptr, 0), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kvarena::gpu
