// The CUDA kernels over the quantized KV formats (int8, fp8_e4m3) on a real device against
// the CPU kernels: append pages byte for byte (codes and scales), gather as the CPU's,
// attention against the CPU kernel and the float64 reference over the same pages. The
// emulator test (emulator_quant_test.cc) checks the same everywhere; these skip without
// a CUDA device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kv_kernels.h"
#include "kernels/cuda/gpu_test_util.h"
#include "kernels/cuda/kv_kernels_cuda.h"
#include "kernels/cuda/quant_test_problems.h"
#include "kernels/cuda/test_problems.h"
#include "tests/support/test_seed.h"

namespace kvarena::gpu {
namespace {

using testing::CompareWithin;
using testing::CpuAttention;
using testing::DecodeAll;
using testing::DeviceBatch;
using testing::DeviceBuffer;
using testing::FillByCpuAppend;
using testing::HostBatch;
using testing::ParamsFor;
using testing::Problem;
using testing::QuantReference;
using testing::RandomActivations;
using testing::RandomStored;
using testing::SameOrBothNan;
using testing::SeqSpec;
using testing::SetRandomStaticScales;

constexpr KvFormat kQuantFormats[] = {KvFormat::kInt8, KvFormat::kFp8E4M3};
constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

class KvKernelsCudaQuantTest : public ::testing::Test {
 protected:
  KvKernelsCudaQuantTest() : seed_(kvarena::testing::TestSeed()), rng_(seed_) {}

  int64_t Rand(int64_t lo, int64_t hi) { return lo + int64_t(rng_() % uint64_t(hi - lo + 1)); }

  void CheckAppendGather(const Problem& pb) {
    SCOPED_TRACE(pb.Describe() + " kv_format=" + KvFormatName(pb.layout.format()));
    const PageLayout& l = pb.layout;
    HostBatch hb(pb, rng_);
    SetRandomStaticScales(pb, hb, rng_);
    const size_t per_seq = size_t(l.num_kv_heads) * pb.n * l.head_dim;
    const size_t seq_bytes = per_seq * l.ActivationBytes();
    const std::vector<uint8_t> k =
        RandomActivations(l.dtype, per_seq * hb.batch(), rng_, 0.05, 1000, 0.002);
    const std::vector<uint8_t> v =
        RandomActivations(l.dtype, per_seq * hb.batch(), rng_, 0.05, 1000, 0.002);
    DeviceBatch single(hb), batched(hb);  // both start as the 0xFF pool
    DeviceBuffer dk(k.data(), k.size()), dv(v.data(), v.size());
    for (int b = 0; b < hb.batch(); ++b) {
      ::kvarena::AppendKv(hb.View(b), pb.seqs[b].pos, pb.n, k.data() + b * seq_bytes,
                          v.data() + b * seq_bytes);
      ASSERT_EQ(gpu::AppendKv(single.View(hb, b), pb.seqs[b].pos, pb.n,
                              dk.get<uint8_t>() + b * seq_bytes, dv.get<uint8_t>() + b * seq_bytes),
                cudaSuccess);
    }
    ASSERT_EQ(AppendKvBatch(batched.Batch(l, hb.batch(), 0), pb.n, dk.get(), dv.get()),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(single.pool.Read(hb.pool().size()) == hb.pool()) << "single";
    EXPECT_TRUE(batched.pool.Read(hb.pool().size()) == hb.pool()) << "batched";
    for (int b = 0; b < hb.batch(); ++b) {
      std::vector<uint8_t> want_k(seq_bytes), want_v(seq_bytes);
      ::kvarena::GatherKv(hb.View(b), pb.seqs[b].pos, pb.n, want_k.data(), want_v.data());
      DeviceBuffer gk(seq_bytes + 16), gv(seq_bytes);
      ASSERT_EQ(cudaMemset(gk.get(), 0xFF, seq_bytes + 16), cudaSuccess);
      ASSERT_EQ(gpu::GatherKv(single.View(hb, b), pb.seqs[b].pos, pb.n, gk.get(), gv.get()),
                cudaSuccess);
      const std::vector<uint8_t> got_k = gk.Read(seq_bytes + 16), got_v = gv.Read(seq_bytes);
      EXPECT_TRUE(SameOrBothNan(l.dtype, got_k.data(), want_k.data(), seq_bytes)) << "K " << b;
      EXPECT_TRUE(SameOrBothNan(l.dtype, got_v.data(), want_v.data(), seq_bytes)) << "V " << b;
      EXPECT_EQ(got_k[seq_bytes], 0xFF) << "gather wrote past its output";
    }
  }

  // Batched, then per sequence; against the CPU kernel below its VNNI tile (float32
  // rounding apart, the same arithmetic) and the float64 reference.
  void CheckAttention(const Problem& pb) {
    SCOPED_TRACE(pb.Describe() + " kv_format=" + KvFormatName(pb.layout.format()));
    const PageLayout& l = pb.layout;
    HostBatch hb(pb, rng_);
    SetRandomStaticScales(pb, hb, rng_);
    FillByCpuAppend(pb, hb, rng_);
    const size_t per_seq = size_t(pb.num_q_heads()) * pb.n * l.head_dim;
    const size_t seq_bytes = per_seq * l.ActivationBytes();
    const std::vector<uint8_t> q = RandomStored(l.dtype, per_seq * hb.batch(), rng_);
    TEST_ForceCpuKernels(CpuKernels::kAvx512);
    const std::vector<double> cpu = DecodeAll(l.dtype, CpuAttention(pb, hb, q));
    TEST_ForceCpuKernels(CpuKernels::kAvx512Bf16);
    const std::vector<double> ref = QuantReference(pb, hb, q);
    DeviceBatch db(hb);
    DeviceBuffer dq(q.data(), q.size());

    int64_t span = 1;
    for (int b = 0; b < hb.batch(); ++b) {
      const int64_t lo =
          std::max(hb.View(b).first_pos(), pb.window > 0 ? pb.seqs[b].pos - pb.window + 1 : 0);
      span = std::max(span, pb.seqs[b].pos + pb.n - lo);
    }
    const PagedKvBatch batch = db.Batch(l, hb.batch(), span);
    const AttentionParams params = ParamsFor(pb, 0);
    size_t ws_bytes = 0;
    ASSERT_EQ(PagedAttentionBatchWorkspaceSize(batch, params, &ws_bytes), cudaSuccess);
    DeviceBuffer ws(ws_bytes);
    const size_t out_bytes = seq_bytes * hb.batch();
    DeviceBuffer out(out_bytes + 64);
    ASSERT_EQ(cudaMemset(out.get(), 0xFF, out_bytes + 64), cudaSuccess);
    ASSERT_EQ(PagedAttentionBatch(batch, params, dq.get(), out.get(), ws.get(), ws_bytes),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> got = out.Read(out_bytes + 64);
    EXPECT_TRUE(std::all_of(got.begin() + out_bytes, got.end(), [](uint8_t x) {
      return x == 0xFF;
    })) << "wrote past the output";
    got.resize(out_bytes);
    Compare(l.dtype, got, ref, cpu, "batched");

    for (int b = 0; b < hb.batch(); ++b) {
      const PagedKvView view = db.View(hb, b);
      const AttentionParams p = ParamsFor(pb, pb.seqs[b].pos);
      ASSERT_EQ(PagedAttentionWorkspaceSize(view, p, &ws_bytes), cudaSuccess);
      DeviceBuffer ws1(ws_bytes), out1(seq_bytes);
      ASSERT_EQ(cudaMemset(out1.get(), 0xFF, seq_bytes), cudaSuccess);
      ASSERT_EQ(PagedAttention(view, p, dq.get<uint8_t>() + b * seq_bytes, out1.get(), ws1.get(),
                               ws_bytes),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      Compare(l.dtype, out1.Read(seq_bytes),
              std::vector<double>(ref.begin() + b * per_seq, ref.begin() + (b + 1) * per_seq),
              std::vector<double>(cpu.begin() + b * per_seq, cpu.begin() + (b + 1) * per_seq),
              "sequence " + std::to_string(b));
    }
  }

  // The device's exp2f is not the host's: a little more room than the emulator test.
  void Compare(DType dtype, const std::vector<uint8_t>& got, const std::vector<double>& ref,
               const std::vector<double>& cpu, const std::string& what) {
    EXPECT_EQ(CompareWithin(dtype, got, ref, 1e-4, 1e-5), "") << what << " vs float64";
    EXPECT_EQ(CompareWithin(dtype, got, cpu, 5e-5, 1e-5), "") << what << " vs the CPU kernel";
  }

  void Sweep(KvFormat format, bool long_context) {
    SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
    for (DType dtype : kDTypes) {
      for (const Problem& pb : testing::QuantAttentionSweep(format, dtype, rng_, long_context)) {
        CheckAttention(pb);
        if (HasFailure()) return;  // one broken config is enough to read
      }
    }
  }

  uint64_t seed_;
  std::mt19937_64 rng_;
};

TEST_F(KvKernelsCudaQuantTest, AppendMatchesCpuByteForByteAndGatherMatchesCpu) {
  SKIP_WITHOUT_GPU();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (KvFormat format : kQuantFormats) {
    for (DType dtype : kDTypes) {
      for (int head_dim : {36, 64, 128, 256}) {
        for (int kv_heads : {1, 2, 3, 4, 8}) {
          Problem pb;
          pb.layout =
              PageLayout{dtype, int(Rand(0, 2) == 0 ? 1 : Rand(2, 64)), kv_heads, head_dim, format};
          pb.n = Rand(1, 40);
          for (int b = 0, batch = int(Rand(1, 4)); b < batch; ++b) {
            SeqSpec s;
            s.pos = Rand(0, 100);
            if (s.pos >= pb.layout.page_size && Rand(0, 1)) {
              s.first_block = Rand(1, s.pos / pb.layout.page_size);
            }
            s.len = s.pos;
            pb.seqs.push_back(s);
          }
          CheckAppendGather(pb);
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST_F(KvKernelsCudaQuantTest, Int8AttentionMatchesCpuAcrossSweep) {
  SKIP_WITHOUT_GPU();
  Sweep(KvFormat::kInt8, false);
}
TEST_F(KvKernelsCudaQuantTest, Fp8AttentionMatchesCpuAcrossSweep) {
  SKIP_WITHOUT_GPU();
  Sweep(KvFormat::kFp8E4M3, false);
}
TEST_F(KvKernelsCudaQuantTest, LongContextsSplitAndMatchCpu) {
  SKIP_WITHOUT_GPU();
  for (KvFormat format : kQuantFormats) Sweep(format, true);
}

// GQA 4 with a window over misaligned int8 rows (3 kv heads) and fp8, long enough to split.
TEST_F(KvKernelsCudaQuantTest, GqaWindowOverLongContexts) {
  SKIP_WITHOUT_GPU();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (KvFormat format : kQuantFormats) {
    for (DType dtype : kDTypes) {
      Problem pb;
      pb.layout = PageLayout{dtype, 16, 3, 128, format};
      pb.group = 4;
      pb.window = 1000;
      pb.scale_factor = 4;
      for (int b = 0; b < 8; ++b) pb.seqs.push_back(SeqSpec{0, Rand(1500, 3000), 0});
      for (SeqSpec& s : pb.seqs) s.len = s.pos + 1;
      CheckAttention(pb);
      if (HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace kvarena::gpu
