// The CUDA kernels over the quantized KV formats (int8, fp8_e4m3), run on the host by the
// fiber emulator (emulator_kernels.h): the device codecs equal kernels/kv_quant.h bit for
// bit, the quantizing append writes the CPU kernel's pages byte for byte (codes and
// scales), gather returns what the CPU's does, and attention over the same pages matches
// the CPU kernel and the float64 reference on the dequantized values.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kv_kernels.h"
#include "kernels/cuda/quant_test_problems.h"
#include "kernels/cuda/test_problems.h"
#include "kernels/kv_quant.h"
#include "tests/support/test_seed.h"
// Last: the kernels compiled for the emulator (defines the CUDA built-ins as macros).
#include "kernels/cuda/emulator_kernels.h"

namespace kvarena::gpu {
namespace {

using testing::CompareWithin;
using testing::CpuAttention;
using testing::DecodeAll;
using testing::FillByCpuAppend;
using testing::HostBatch;
using testing::ParamsFor;
using testing::Problem;
using testing::QuantReference;
using testing::RandomActivations;
using testing::RandomStored;
using testing::RunEmulatedAttention;
using testing::SameOrBothNan;
using testing::SeqSpec;
using testing::SetRandomStaticScales;

constexpr KvFormat kQuantFormats[] = {KvFormat::kInt8, KvFormat::kFp8E4M3};
constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

class EmulatorQuantTest : public ::testing::Test {
 protected:
  EmulatorQuantTest() : seed_(kvarena::testing::TestSeed()), rng_(seed_) {}

  int64_t Rand(int64_t lo, int64_t hi) { return lo + int64_t(rng_() % uint64_t(hi - lo + 1)); }

  // Emulated append (batched form) vs the CPU's, then emulated gather (single form) vs
  // the CPU's, for one problem.
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
    a.k = const_cast<uint8_t*>(k.data());
    a.v = const_cast<uint8_t*>(v.data());
    a.scales[0] = hb.View(0).k_scales;
    a.scales[1] = hb.View(0).v_scales;
    dim3 grid;
    bool launch = false;
    ASSERT_EQ(PrepareQuantAppend(l, hb.batch(), pb.n, 0, &a, &grid, &launch), cudaSuccess);
    ASSERT_TRUE(launch);
    Emulate(l, grid, a, false);
    if (hb.pool() != want) {
      size_t i = 0;
      while (hb.pool()[i] == want[i]) ++i;
      ADD_FAILURE() << "pages differ from the CPU's first at pool byte " << i << " (page "
                    << i / l.PageBytes() << ", byte " << i % l.PageBytes() << " of "
                    << l.PageBytes() << "): got " << int(hb.pool()[i]) << " want " << int(want[i]);
      return;
    }

    for (int b = 0; b < hb.batch(); ++b) {
      const PagedKvView view = hb.View(b);
      std::vector<uint8_t> want_k(seq_bytes), want_v(seq_bytes);
      ::kvarena::GatherKv(view, pb.seqs[b].pos, pb.n, want_k.data(), want_v.data());
      std::vector<uint8_t> k_out(seq_bytes + 16, 0xFF), v_out(seq_bytes + 16, 0xFF);
      AppendArgs g{};
      g.pool = hb.pool().data();
      g.tables = view.block_table;
      g.one = PagedSeqDesc{0, pb.seqs[b].first_block, pb.seqs[b].pos};
      g.k = k_out.data();
      g.v = v_out.data();
      g.scales[0] = view.k_scales;
      g.scales[1] = view.v_scales;
      ASSERT_EQ(PrepareQuantAppend(l, 1, pb.n, pb.seqs[b].pos, &g, &grid, &launch), cudaSuccess);
      Emulate(l, grid, g, true);
      EXPECT_TRUE(SameOrBothNan(l.dtype, k_out.data(), want_k.data(), seq_bytes)) << "K " << b;
      EXPECT_TRUE(SameOrBothNan(l.dtype, v_out.data(), want_v.data(), seq_bytes)) << "V " << b;
      EXPECT_EQ(k_out[seq_bytes], 0xFF) << "gather wrote past its output";
    }
  }

  void Emulate(const PageLayout& l, dim3 grid, const AppendArgs& a, bool gather) {
    ASSERT_EQ(DispatchDType(l.dtype,
                            [&](auto t) {
                              using T = decltype(t);
                              return DispatchKvStorage<T>(l.format(), l.dtype, [&](auto kv) {
                                using KV = decltype(kv);
                                if constexpr (std::is_same_v<KV, T>) {
                                  return cudaErrorInvalidValue;
                                } else {
                                  emu::LaunchGrid(grid, dim3(kAppendThreads), nullptr, 0, [&] {
                                    if (gather) {
                                      gpu_emu::QuantGatherKvKernel<T, KV>(a);
                                    } else {
                                      gpu_emu::QuantAppendKvKernel<T, KV>(a);
                                    }
                                  });
                                  return cudaSuccess;
                                }
                              });
                            }),
              cudaSuccess);
  }

  // Emulated attention (batched, then per sequence) vs the CPU kernel and the float64
  // reference over the same pages, filled by the CPU's append. Returns the most splits.
  int CheckAttention(const Problem& pb, int64_t slots) {
    SCOPED_TRACE(pb.Describe() + " kv_format=" + KvFormatName(pb.layout.format()));
    const PageLayout& l = pb.layout;
    HostBatch hb(pb, rng_);
    SetRandomStaticScales(pb, hb, rng_);
    FillByCpuAppend(pb, hb, rng_);
    const size_t per_seq = size_t(pb.num_q_heads()) * pb.n * l.head_dim;
    const size_t seq_bytes = per_seq * l.ActivationBytes();
    const std::vector<uint8_t> q = RandomStored(l.dtype, per_seq * hb.batch(), rng_);
    // The CPU kernel below its VNNI and bf16 dot-product tiles, which round q (to int8 for
    // int8 caches, to bf16 for fp8 ones: attention.cc), computes what these kernels do, so
    // within float32 rounding. The default tiles are not compared: how far q's rounding
    // moves an output depends on the softmax's sharpness, and no fixed bound holds.
    TEST_ForceCpuKernels(CpuKernels::kAvx512);
    const std::vector<double> cpu = DecodeAll(l.dtype, CpuAttention(pb, hb, q));
    TEST_ForceCpuKernels(CpuKernels::kAvx512Bf16);  // back to the default
    const std::vector<double> ref = QuantReference(pb, hb, q);

    int64_t span = 1;
    for (int b = 0; b < hb.batch(); ++b) {
      const int64_t lo =
          std::max(hb.View(b).first_pos(), pb.window > 0 ? pb.seqs[b].pos - pb.window + 1 : 0);
      span = std::max(span, pb.seqs[b].pos + pb.n - lo);
    }
    std::vector<uint8_t> got(seq_bytes * hb.batch() + 64, 0xFF);  // poisoned, guard band
    AttentionArgs a{};
    a.pool = hb.pool().data();
    a.tables = hb.tables().data();
    a.seqs = hb.descs().data();
    a.q = q.data();
    a.out = got.data();
    a.k_scales = hb.View(0).k_scales;
    a.v_scales = hb.View(0).v_scales;
    int splits = RunEmulatedAttention(l, ParamsFor(pb, 0), a, hb.batch(), span, slots);
    EXPECT_TRUE(std::all_of(got.end() - 64, got.end(), [](uint8_t x) { return x == 0xFF; }));
    got.resize(seq_bytes * hb.batch());
    Compare(l.dtype, got, ref, cpu, "batched");

    std::vector<uint8_t> one(seq_bytes);
    for (int b = 0; b < hb.batch(); ++b) {
      const PagedKvView view = hb.View(b);
      std::fill(one.begin(), one.end(), 0xFF);
      AttentionArgs s{};
      s.pool = view.pool_base;
      s.tables = view.block_table;
      s.one = PagedSeqDesc{0, view.first_block, pb.seqs[b].pos};
      s.q = q.data() + b * seq_bytes;
      s.out = one.data();
      s.k_scales = view.k_scales;
      s.v_scales = view.v_scales;
      const AttentionParams p = ParamsFor(pb, pb.seqs[b].pos);
      const int64_t lo = std::max(view.first_pos(), p.window > 0 ? p.q_pos - p.window + 1 : 0);
      splits = std::max(splits, RunEmulatedAttention(l, p, s, 1, p.q_pos + p.n - lo, slots));
      Compare(l.dtype, one,
              std::vector<double>(ref.begin() + b * per_seq, ref.begin() + (b + 1) * per_seq),
              std::vector<double>(cpu.begin() + b * per_seq, cpu.begin() + (b + 1) * per_seq),
              "sequence " + std::to_string(b));
    }
    return splits;
  }

  // Against the float64 reference and the CPU kernel's float path: float32 rounding only.
  void Compare(DType dtype, const std::vector<uint8_t>& got, const std::vector<double>& ref,
               const std::vector<double>& cpu, const std::string& what) {
    EXPECT_EQ(CompareWithin(dtype, got, ref, 1e-4, 1e-5), "") << what << " vs float64";
    EXPECT_EQ(CompareWithin(dtype, got, cpu, 2e-5, 1e-6), "") << what << " vs the CPU kernel";
  }

  uint64_t seed_;
  std::mt19937_64 rng_;
};

TEST_F(EmulatorQuantTest, DeviceCodecsMatchKvQuantBitForBit) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (int c = 0; c < 256; ++c) {
    const float want = DecodeFp8E4M3(uint8_t(c)), got = DecodeFp8(uint8_t(c));
    EXPECT_TRUE(std::memcmp(&want, &got, 4) == 0 || (std::isnan(want) && std::isnan(got))) << c;
  }
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           448.0f,
                           464.0f,
                           480.0f,
                           1e30f,
                           0x1p-6f,
                           0x1p-9f,
                           0x1p-10f,
                           0x3p-11f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::denorm_min()};
  for (int c = 0; c < 127; ++c) {  // each code's value, the midpoints and their neighbours
    const float v = DecodeFp8E4M3(uint8_t(c)), w = DecodeFp8E4M3(uint8_t(c + 1));
    const float mid = (v + w) / 2;
    for (float x : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (int i = 0; i < (1 << 20); ++i) {  // random bit patterns: every exponent
    const uint32_t u = uint32_t(rng_());
    float x;
    std::memcpy(&x, &u, 4);
    xs.push_back(x);
  }
  for (float x : xs) {
    ASSERT_EQ(EncodeFp8(x), EncodeFp8E4M3(x)) << x;
  }
  std::uniform_real_distribution<float> u(-3, 3);
  for (int i = 0; i < (1 << 16); ++i) {
    float row[8];
    for (float& e : row) e = u(rng_) * float(1 << (i % 8));
    const float scale = Int8Scale(row, 8);
    int8_t want[8];
    QuantizeInt8(row, 8, scale, want);
    for (int d = 0; d < 8; ++d) ASSERT_EQ(EncodeInt8(row[d], scale), want[d]) << row[d];
  }
  for (float scale :
       {0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_EQ(EncodeInt8(1.0f, scale), 0);
  }
}

TEST_F(EmulatorQuantTest, AppendMatchesCpuByteForByteAndGatherMatchesCpu) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (KvFormat format : kQuantFormats) {
    for (DType dtype : kDTypes) {
      for (int head_dim : {36, 64, 128, 256}) {
        for (int kv_heads : {1, 2, 3, 4}) {
          Problem pb;
          pb.layout =
              PageLayout{dtype, int(Rand(0, 2) == 0 ? 1 : Rand(2, 17)), kv_heads, head_dim, format};
          pb.n = Rand(1, 12);
          for (int b = 0, batch = int(Rand(1, 3)); b < batch; ++b) {
            SeqSpec s;
            s.pos = Rand(0, 40);
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

// A sample of the sweep in each format and dtype (the emulator is slow).
TEST_F(EmulatorQuantTest, AttentionMatchesCpuAndFloat64AcrossSweepSample) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (KvFormat format : kQuantFormats) {
    for (DType dtype : kDTypes) {
      const std::vector<Problem> sweep = testing::QuantAttentionSweep(format, dtype, rng_, false);
      for (size_t i = size_t(Rand(0, 23)); i < sweep.size(); i += 24) {
        CheckAttention(sweep[i], 1 << 20);
        if (HasFailure()) return;
      }
    }
  }
}

// GQA (group 4) with a window, over misaligned int8 rows (3 kv heads) and fp8 with its
// static scales, on a "device" of 64 CTAs: long keys split across CTAs and merge.
TEST_F(EmulatorQuantTest, GqaWindowSplitsAndMerges) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (KvFormat format : kQuantFormats) {
    for (DType dtype : kDTypes) {
      Problem pb;
      pb.layout = PageLayout{dtype, 16, 3, 128, format};
      pb.group = 4;
      pb.window = 300;
      pb.n = dtype == DType::kFloat32 ? 3 : 1;
      pb.scale_factor = 4;
      pb.seqs = {{0, 700, 703}, {5, 420, 423}};
      EXPECT_GT(CheckAttention(pb, 64), 1) << "no split";
      if (HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace kvarena::gpu
