// The CUDA kernels' own source, run on the host by the fiber emulator (emulator.h) and
// compared with the CPU kernels: the kernels' logic is checked on every machine, through
// the same argument preparation (kernel_args.cc) the real launchers use. The GPU test
// (kv_kernels_cuda_test.cc) checks the real thing where a GPU is present.
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/kv_kernels.h"
#include "kernels/cuda/test_problems.h"
#include "tests/support/test_seed.h"
// Last: the kernels compiled for the emulator (defines the CUDA built-ins as macros).
#include "kernels/cuda/emulator_kernels.h"

namespace kvarena::gpu {
namespace {

using testing::CompareOutputs;
using testing::CpuAttention;
using testing::HostBatch;
using testing::ParamsFor;
using testing::Problem;
using testing::RandomStored;
using testing::RunEmulatedAttention;
using testing::SeqSpec;

class EmulatorTest : public ::testing::Test {
 protected:
  EmulatorTest() : seed_(kvarena::testing::TestSeed()), rng_(seed_) {}

  int RunAttention(const PageLayout& layout, const AttentionParams& p, AttentionArgs a, int batch,
                   int64_t max_span, int64_t slots) {
    return RunEmulatedAttention(layout, p, a, batch, max_span, slots);
  }

  // Runs pb through the batched path and, sequence by sequence, the single-cache path;
  // both must match the CPU kernel. max_span_hint < 0: the true span. Returns max splits.
  int CheckAttention(const Problem& pb, int64_t slots, int64_t max_span_hint = -1) {
    SCOPED_TRACE(pb.Describe());
    HostBatch hb(pb, rng_);
    hb.FillRandom(rng_);
    const size_t per_seq = size_t(pb.num_q_heads()) * pb.n * pb.layout.head_dim;
    const std::vector<uint8_t> q = RandomStored(pb.layout.dtype, per_seq * hb.batch(), rng_);
    const std::vector<uint8_t> want = CpuAttention(pb, hb, q);
    int max_splits = 0;

    int64_t span = 1;
    for (int b = 0; b < hb.batch(); ++b) {
      const int64_t lo =
          std::max(hb.View(b).first_pos(), pb.window > 0 ? pb.seqs[b].pos - pb.window + 1 : 0);
      span = std::max(span, pb.seqs[b].pos + pb.n - lo);
    }
    std::vector<uint8_t> got(want.size() + 64, 0xFF);  // NaN-poisoned, with a guard band
    AttentionArgs a{};
    a.pool = hb.pool().data();
    a.tables = hb.tables().data();
    a.seqs = hb.descs().data();
    a.q = q.data();
    a.out = got.data();
    max_splits = RunAttention(pb.layout, ParamsFor(pb, 0), a, hb.batch(),
                              max_span_hint >= 0 ? max_span_hint : span, slots);
    EXPECT_TRUE(
        std::all_of(got.begin() + want.size(), got.end(), [](uint8_t x) { return x == 0xFF; }));
    got.resize(want.size());
    EXPECT_EQ(CompareOutputs(pb.layout.dtype, got, want, pb.layout.head_dim), "") << "batched";

    const size_t seq_bytes = per_seq * pb.layout.ActivationBytes();
    std::vector<uint8_t> one(seq_bytes, 0xFF);
    for (int b = 0; b < hb.batch(); ++b) {
      const PagedKvView view = hb.View(b);
      std::fill(one.begin(), one.end(), 0xFF);
      AttentionArgs s{};
      s.pool = view.pool_base;
      s.tables = view.block_table;
      s.one = PagedSeqDesc{0, view.first_block, pb.seqs[b].pos};
      s.q = q.data() + b * seq_bytes;
      s.out = one.data();
      const AttentionParams p = ParamsFor(pb, pb.seqs[b].pos);
      const int64_t lo = std::max(view.first_pos(), p.window > 0 ? p.q_pos - p.window + 1 : 0);
      max_splits =
          std::max(max_splits, RunAttention(pb.layout, p, s, 1, p.q_pos + p.n - lo, slots));
      const std::vector<uint8_t> want_b(want.begin() + b * seq_bytes,
                                        want.begin() + (b + 1) * seq_bytes);
      EXPECT_EQ(CompareOutputs(pb.layout.dtype, one, want_b, pb.layout.head_dim), "")
          << "sequence " << b;
    }
    return max_splits;
  }

  int64_t Rand(int64_t lo, int64_t hi) { return lo + int64_t(rng_() % uint64_t(hi - lo + 1)); }

  uint64_t seed_;
  std::mt19937_64 rng_;
};

TEST_F(EmulatorTest, AppendMatchesCpuByteForByteAndGatherReadsItBack) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int head_dim : {36, 64, 128, 256}) {  // 36 x 2 bytes = 72-byte rows: the 2-byte path
      for (int page_size : {1, 3, 16, 64}) {
        Problem pb;
        pb.layout = PageLayout{dtype, page_size, 2, head_dim};
        pb.n = Rand(1, 20);
        for (int b = 0, batch = int(Rand(1, 3)); b < batch; ++b) {
          SeqSpec s;
          s.pos = Rand(0, 50);
          if (s.pos >= page_size && Rand(0, 1)) s.first_block = Rand(1, s.pos / page_size);
          s.len = s.pos;
          pb.seqs.push_back(s);
        }
        SCOPED_TRACE(pb.Describe());
        HostBatch hb(pb, rng_);
        const size_t per_seq = size_t(pb.layout.num_kv_heads) * pb.n * head_dim;
        std::vector<uint8_t> k = RandomStored(dtype, per_seq * hb.batch(), rng_);
        std::vector<uint8_t> v = RandomStored(dtype, per_seq * hb.batch(), rng_);
        const size_t seq_bytes = per_seq * pb.layout.ElemBytes();

        const std::vector<uint8_t> before = hb.pool();
        for (int b = 0; b < hb.batch(); ++b) {
          ::kvarena::AppendKv(hb.View(b), pb.seqs[b].pos, pb.n, k.data() + b * seq_bytes,
                              v.data() + b * seq_bytes);
        }
        const std::vector<uint8_t> want = hb.pool();

        hb.pool() = before;
        AppendArgs a{};
        a.pool = hb.pool().data();
        a.tables = hb.tables().data();
        a.seqs = hb.descs().data();
        a.k = k.data();
        a.v = v.data();
        int vec_bytes = 0;
        dim3 grid;
        bool launch = false;
        ASSERT_EQ(PrepareAppend(pb.layout, hb.batch(), pb.n, 0, &a, &vec_bytes, &grid, &launch),
                  cudaSuccess);
        ASSERT_TRUE(launch);
        EXPECT_EQ(vec_bytes, pb.layout.head_dim * pb.layout.ElemBytes() % 16 == 0 ? 16 : 2);
        emu::LaunchGrid(grid, dim3(kAppendThreads), nullptr, 0, [&] {
          if (vec_bytes == 16) {
            gpu_emu::AppendKvKernel<uint4>(a);
          } else {
            gpu_emu::AppendKvKernel<uint16_t>(a);
          }
        });
        EXPECT_TRUE(hb.pool() == want);

        // Gather every sequence's new tokens back out (single-cache form).
        for (int b = 0; b < hb.batch(); ++b) {
          std::vector<uint8_t> k_out(seq_bytes + 16, 0xFF), v_out(seq_bytes + 16, 0xFF);
          AppendArgs g{};
          g.pool = hb.pool().data();
          g.tables = hb.View(b).block_table;
          g.one = PagedSeqDesc{0, pb.seqs[b].first_block, pb.seqs[b].pos};
          g.k = k_out.data();
          g.v = v_out.data();
          ASSERT_EQ(
              PrepareAppend(pb.layout, 1, pb.n, pb.seqs[b].pos, &g, &vec_bytes, &grid, &launch),
              cudaSuccess);
          emu::LaunchGrid(grid, dim3(kAppendThreads), nullptr, 0, [&] {
            if (vec_bytes == 16) {
              gpu_emu::GatherKvKernel<uint4>(g);
            } else {
              gpu_emu::GatherKvKernel<uint16_t>(g);
            }
          });
          EXPECT_TRUE(std::equal(k.begin() + b * seq_bytes, k.begin() + (b + 1) * seq_bytes,
                                 k_out.begin()));
          EXPECT_TRUE(std::equal(v.begin() + b * seq_bytes, v.begin() + (b + 1) * seq_bytes,
                                 v_out.begin()));
          EXPECT_EQ(k_out[seq_bytes], 0xFF);  // nothing past the output
        }
        if (HasFailure()) return;
      }
    }
  }
}

// A sample of the GPU test's sweep (the emulator is slow), every dtype.
TEST_F(EmulatorTest, AttentionMatchesCpuAcrossSweepSample) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const std::vector<Problem> sweep = testing::AttentionSweep(dtype, rng_, false);
    for (size_t i = size_t(Rand(0, 7)); i < sweep.size(); i += 8) {
      CheckAttention(sweep[i], 1 << 20);
      if (HasFailure()) return;
    }
  }
}

// Long contexts on a "device" of 64 resident CTAs: keys split across CTAs and merge.
TEST_F(EmulatorTest, LongContextsSplitAndMerge) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  int most = 1;
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const std::vector<Problem> sweep = testing::AttentionSweep(dtype, rng_, true);
    for (size_t i = size_t(Rand(0, 31)); i < sweep.size(); i += 32) {
      most = std::max(most, CheckAttention(sweep[i], 64));
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(most, 1);
}

// A span hint far above the truth makes most splits empty; they must weigh nothing.
TEST_F(EmulatorTest, EmptySplitsWeighNothing) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  Problem pb;
  pb.layout = PageLayout{DType::kBFloat16, 16, 2, 128};
  pb.group = 4;
  pb.window = 7;
  pb.seqs = {{0, 40, 41}, {1, 100, 101}};
  EXPECT_GT(CheckAttention(pb, 1 << 20, 6000), 40);
}

}  // namespace
}  // namespace kvarena::gpu
