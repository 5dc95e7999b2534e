#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numbers>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kv_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/support/test_paged_layer.h"
#include "tests/support/test_seed.h"

namespace kvarena {
namespace {

using kvarena::testing::DecodeAll;
using kvarena::testing::RandomStored;
using kvarena::testing::ReferenceAttention;
using kvarena::testing::TestPagedLayer;

// One attention problem: a paged layer with random K/V, random q, and the parameters.
struct Problem {
  PageLayout layout;
  int group = 1;
  int64_t first_block = 0, q_pos = 0, n = 1, extra = 0;  // len = q_pos + n + extra
  int64_t window = 0;
  float scale_factor = 1;  // scale = scale_factor / sqrt(head_dim)
};

// How the kernel is run: the kernel family forced (TEST_ForceCpuKernels), on the pool or not.
struct Variant {
  CpuKernels kernels;
  bool pooled;
};

std::string VariantName(const Variant& variant) {
  return std::string(CpuKernelsName(variant.kernels)) + (variant.pooled ? " pooled" : " no-pool");
}

class PagedAttentionTest : public ::testing::Test {
 protected:
  PagedAttentionTest() : seed_(kvarena::testing::TestSeed()), rng_(seed_), pool_(2) {
    TEST_ForceCpuKernels(CpuKernels::kAvx512Bf16);
    default_kernels_ = CpuKernelsInUse();
  }
  ~PagedAttentionTest() override { TEST_ForceCpuKernels(CpuKernels::kAvx512Bf16); }

  // The tile PagedAttention picks for head_dim and dtype with `kernels` forced.
  static cpu_internal::AttendTileFn TileWith(CpuKernels kernels, int head_dim, DType dtype,
                                             KvFormat format = KvFormat::kUnspecified) {
    TEST_ForceCpuKernels(kernels);
    const cpu_internal::AttendTileFn fn =
        cpu_internal::SelectAttendTile(head_dim, dtype, ResolveKvFormat(format, dtype));
    TEST_ForceCpuKernels(CpuKernels::kAvx512Bf16);
    return fn;
  }

  // Every kernel family this machine runs (up to KVARENA_CPU_KERNELS), each with and
  // without the pool; a family that picks the same tile as a lower one for this head_dim
  // and dtype (e.g. avx512_bf16 on f16) is left out as a repeat.
  std::vector<Variant> VariantsFor(int head_dim, DType dtype,
                                   KvFormat format = KvFormat::kUnspecified) const {
    std::vector<Variant> variants;
    std::vector<cpu_internal::AttendTileFn> seen;
    for (int k = 0; k <= int(default_kernels_); ++k) {
      const cpu_internal::AttendTileFn fn = TileWith(CpuKernels(k), head_dim, dtype, format);
      if (std::find(seen.begin(), seen.end(), fn) != seen.end()) continue;
      seen.push_back(fn);
      variants.push_back({CpuKernels(k), false});
      variants.push_back({CpuKernels(k), true});
    }
    return variants;
  }

  int64_t Rand(int64_t lo, int64_t hi) {  // uniform in [lo, hi]
    return lo + int64_t(rng_() % uint64_t(hi - lo + 1));
  }

  // Runs PagedAttention with poisoned (NaN) output and a guard band after it; returns the
  // decoded output.
  std::vector<double> RunKernel(const PagedKvView& view, const AttentionParams& params,
                                const std::vector<uint8_t>& q, Variant variant) {
    TEST_ForceCpuKernels(variant.kernels);
    EXPECT_EQ(CpuKernelsInUse(), variant.kernels);
    const size_t bytes = q.size();
    std::vector<uint8_t> out(bytes + 64, 0xFF);
    PagedAttention(view, params, q.data(), out.data(), variant.pooled ? &pool_ : nullptr);
    TEST_ForceCpuKernels(CpuKernels::kAvx512Bf16);
    EXPECT_TRUE(std::all_of(out.begin() + bytes, out.end(), [](uint8_t b) { return b == 0xFF; }))
        << "wrote past the output";
    out.resize(bytes);
    return DecodeAll(view.layout.dtype, out);
  }

  // q [num_q_heads][n][dim] as the VNNI tile multiplies it: each row x scale * log2(e) in
  // float32 (as PagedAttention scales q), quantized to int8 with the row's own scale
  // max|x| / 127 and rint (the format's int8, written here from its definition), then
  // divided by scale * log2(e) again, so that the reference's scores are the tile's.
  static std::vector<double> Int8Queries(const std::vector<double>& q, int dim, float scale) {
    const float factor = scale * std::numbers::log2e_v<float>;
    std::vector<double> out(q.size());
    for (size_t row = 0; row < q.size() / size_t(dim); ++row) {
      std::vector<float> x(static_cast<size_t>(dim));
      float amax = 0;
      for (int d = 0; d < dim; ++d) {
        x[size_t(d)] = float(q[row * dim + d]) * factor;
        amax = std::max(amax, std::fabs(x[size_t(d)]));
      }
      const float s = amax / 127.0f;
      for (int d = 0; d < dim; ++d) {
        const float code = s > 0 ? std::clamp(std::rint(x[size_t(d)] / s), -127.0f, 127.0f) : 0;
        out[row * dim + d] = double(code) * double(s) / double(factor);
      }
    }
    return out;
  }

  // q [num_q_heads][n][dim] as the tile for fp8 pages on AVX512_BF16 multiplies it:
  // each element rounded to bf16, to nearest even (bf16 activations are already).
  static std::vector<double> BFloat16Queries(const std::vector<double>& q) {
    std::vector<double> out(q.size());
    for (size_t i = 0; i < q.size(); ++i) {
      uint32_t bits;
      const float x = float(q[i]);
      std::memcpy(&bits, &x, 4);
      bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;  // finite q only
      float y;
      std::memcpy(&y, &bits, 4);
      out[i] = y;
    }
    return out;
  }

  // Checks every variant (each kernel family the machine has, with / without the pool)
  // against the float64 reference of the stored values (with q as the tile multiplies it).
  // The error allowed is float32 accumulation plus half an output ULP of the dtype. `edit`,
  // if set, changes the random pages before the run.
  void CheckProblem(const Problem& pb, const std::function<void(TestPagedLayer&)>& edit = {}) {
    const int64_t len = pb.q_pos + pb.n + pb.extra;
    TestPagedLayer layer(pb.layout, pb.first_block, len, rng_);
    layer.FillRandom(rng_);
    if (edit) edit(layer);
    const int num_q_heads = pb.layout.num_kv_heads * pb.group;
    const std::vector<uint8_t> q =
        RandomStored(pb.layout.dtype, size_t(num_q_heads) * pb.n * pb.layout.head_dim, rng_);
    AttentionParams params;
    params.num_q_heads = num_q_heads;
    params.q_pos = pb.q_pos;
    params.n = pb.n;
    params.scale = pb.scale_factor / std::sqrt(float(pb.layout.head_dim));
    params.window = pb.window;
    const std::vector<double> q_values = DecodeAll(pb.layout.dtype, q);
    const std::vector<double> want_q =
        ReferenceAttention(layer, q_values, num_q_heads, pb.q_pos, pb.n, params.scale, pb.window);
    // The VNNI tile multiplies K by q quantized per row: its reference takes that q.
    const std::vector<double> want_q8 =
        ReferenceAttention(layer, Int8Queries(q_values, pb.layout.head_dim, params.scale),
                           num_q_heads, pb.q_pos, pb.n, params.scale, pb.window);
    // So does the fp8 tile on AVX512_BF16, with q rounded to bf16.
    const std::vector<double> want_qb = ReferenceAttention(
        layer, BFloat16Queries(q_values), num_q_heads, pb.q_pos, pb.n, params.scale, pb.window);

    const double out_rel = pb.layout.dtype == DType::kFloat16    ? 0x1p-11
                           : pb.layout.dtype == DType::kBFloat16 ? 0x1p-8
                                                                 : 0.0;
    for (const Variant& variant :
         VariantsFor(pb.layout.head_dim, pb.layout.dtype, pb.layout.kv_format)) {
      SCOPED_TRACE(VariantName(variant));
      const cpu_internal::AttendTileFn fn =
          TileWith(variant.kernels, pb.layout.head_dim, pb.layout.dtype, pb.layout.kv_format);
      const std::vector<double>& want = fn == &cpu_internal::Avx512VnniAttendTile      ? want_q8
                                        : fn == &cpu_internal::Avx512Bf16Fp8AttendTile ? want_qb
                                                                                       : want_q;
      const std::vector<double> got = RunKernel(layer.view(), params, q, variant);
      size_t bad = 0;
      for (size_t i = 0; i < want.size() && bad < 5; ++i) {
        const double tol = 1e-5 + out_rel * std::fabs(want[i]);
        const bool ok = std::isnan(want[i]) ? std::isnan(got[i])
                                            : std::fabs(got[i] - want[i]) <= tol;  // NaN fails
        if (!ok) {
          ++bad;
          ADD_FAILURE() << "element " << i << " (head " << i / pb.layout.head_dim / pb.n
                        << ", query " << i / pb.layout.head_dim % pb.n << "): got " << got[i]
                        << " want " << want[i];
        }
      }
    }
  }

  static std::string Describe(const Problem& pb) {
    std::ostringstream s;
    s << DTypeName(pb.layout.dtype) << " kv_format=" << KvFormatName(pb.layout.format())
      << " head_dim=" << pb.layout.head_dim << " page_size=" << pb.layout.page_size
      << " kv_heads=" << pb.layout.num_kv_heads << " group=" << pb.group << " window=" << pb.window
      << " first_block=" << pb.first_block << " q_pos=" << pb.q_pos << " n=" << pb.n
      << " extra=" << pb.extra << " scale_factor=" << pb.scale_factor;
    return s.str();
  }

  // The sweep for one dtype: head_dim x page_size x group x window, each with a random
  // decode and a random prefill problem (random lengths, sometimes an evicted prefix),
  // each run by every kernel family the machine has, with and without the pool.
  void Sweep(DType dtype, KvFormat format = KvFormat::kUnspecified) {
    SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
    for (int head_dim : {64, 128, 256}) {
      for (int page_size : {1, 8, 16, 32}) {
        for (int group : {1, 4, 8}) {
          for (int window : {0, 2, 5, 17}) {
            for (int64_t n : {int64_t(1), Rand(2, 12)}) {
              Problem pb;
              pb.layout.dtype = dtype;
              pb.layout.kv_format = format;
              pb.layout.head_dim = head_dim;
              pb.layout.page_size = page_size;
              pb.layout.num_kv_heads = 2;
              pb.group = group;
              pb.window = window;
              pb.n = n;
              pb.q_pos = Rand(0, 90);
              pb.extra = Rand(0, 3) == 0 ? Rand(1, 5) : 0;
              if (pb.q_pos >= page_size && Rand(0, 1) == 1) {
                pb.first_block = Rand(1, pb.q_pos / page_size);  // evicted prefix
              }
              pb.scale_factor = Rand(0, 1) == 1 ? 4.0f : 1.0f;
              SCOPED_TRACE(Describe(pb));
              CheckProblem(pb);
              if (HasFailure()) return;  // one broken config is enough to read
            }
          }
        }
      }
    }
  }

  uint64_t seed_;
  std::mt19937_64 rng_;
  ThreadPool pool_;
  CpuKernels default_kernels_ = CpuKernels::kPortable;  // in use before any forcing
};

TEST_F(PagedAttentionTest, Float32MatchesReferenceAcrossSweep) { Sweep(DType::kFloat32); }
TEST_F(PagedAttentionTest, Float16MatchesReferenceAcrossSweep) { Sweep(DType::kFloat16); }
TEST_F(PagedAttentionTest, BFloat16MatchesReferenceAcrossSweep) { Sweep(DType::kBFloat16); }
// int8 pages (codes and per-token scales) against the float64 reference of the values the
// format defines (code x scale): the kernels add nothing beyond float32 accumulation.
TEST_F(PagedAttentionTest, Int8WithFloat16QueriesMatchesReferenceAcrossSweep) {
  Sweep(DType::kFloat16, KvFormat::kInt8);
}
TEST_F(PagedAttentionTest, Int8WithBFloat16QueriesMatchesReferenceAcrossSweep) {
  Sweep(DType::kBFloat16, KvFormat::kInt8);
}
// fp8 e4m3 pages with a static K and V scale per head, against the reference of
// value(code) x scale (the test's own decoder): every code below 2, subnormals included.
TEST_F(PagedAttentionTest, Fp8WithFloat16QueriesMatchesReferenceAcrossSweep) {
  Sweep(DType::kFloat16, KvFormat::kFp8E4M3);
}
TEST_F(PagedAttentionTest, Fp8WithFloat32QueriesMatchesReferenceAcrossSweep) {
  Sweep(DType::kFloat32, KvFormat::kFp8E4M3);
}
TEST_F(PagedAttentionTest, Fp8WithBFloat16QueriesMatchesReferenceAcrossSweep) {
  Sweep(DType::kBFloat16, KvFormat::kFp8E4M3);
}

// fp8 K of every finite code (the sweeps stay below 2), and of zeros and subnormals only
// (where the scores hang on them alone), on every family: exact up to float32 sums. One V
// code of the last token is NaN, so the tile holding it takes the fp8 tile's NaN path
// (and that dim of kv head 0's rows is NaN); head_dim 160 has a 32-dim tail for its scan.
TEST_F(PagedAttentionTest, Fp8EveryKCodeMatchesReference) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int top : {0x07, 0x7E}) {  // largest magnitude code
      const int dim = top == 0x07 ? 128 : 160;
      Problem pb;
      pb.layout = {dtype, 16, 2, dim, KvFormat::kFp8E4M3};
      pb.group = 4;
      pb.q_pos = Rand(40, 200);
      pb.scale_factor = top == 0x07 ? 4096.0f : 0.01f;  // scores of a few units
      SCOPED_TRACE(Describe(pb) + " top=" + std::to_string(top));
      CheckProblem(pb, [&](TestPagedLayer& layer) {
        for (int64_t t = layer.view().first_pos(); t < layer.view().len; ++t) {
          for (int h = 0; h < 2; ++h) {
            for (int d = 0; d < dim; ++d) {
              *layer.At(0, t, h, d) = uint8_t(Rand(0, top) | (Rand(0, 1) << 7));
            }
          }
        }
        *layer.At(1, pb.q_pos, 0, dim - 3) = 0xFF;
      });
    }
  }
}

// A NaN code in K (or V) of a visible token makes every output row that sees it NaN (in V:
// that dim) and leaves the other kv head alone, on every family.
TEST_F(PagedAttentionTest, Fp8NaNCodePropagates) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (int kv : {0, 1}) {
      for (uint8_t nan : {uint8_t(0x7F), uint8_t(0xFF)}) {
        const PageLayout layout{dtype, 16, 2, 64, KvFormat::kFp8E4M3};
        TestPagedLayer layer(layout, 0, 100, rng_);
        layer.FillRandom(rng_);
        const int64_t t = Rand(0, 99);
        const int d = int(Rand(0, 63));
        *layer.At(kv, t, 0, d) = nan;  // kv head 0
        AttentionParams params;
        params.num_q_heads = 8;
        params.q_pos = 99;
        params.scale = 0.125f;
        const std::vector<uint8_t> q = RandomStored(dtype, size_t(8) * 64, rng_);
        for (const Variant& variant : VariantsFor(64, dtype, layout.kv_format)) {
          SCOPED_TRACE(::testing::Message()
                       << DTypeName(dtype) << " kv=" << kv << " nan=" << int(nan) << " t=" << t
                       << " d=" << d << " " << VariantName(variant));
          const std::vector<double> got = RunKernel(layer.view(), params, q, variant);
          size_t bad = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            const bool head0 = i < got.size() / 2;  // q heads 0..3 read kv head 0
            const bool want_nan = head0 && (kv == 0 || int(i % 64) == d);
            bad += std::isnan(got[i]) != want_nan;
          }
          EXPECT_EQ(bad, 0u);
        }
      }
    }
  }
}

// Long contexts: decode splits the keys across units (flash-decoding) and merges them.
TEST_F(PagedAttentionTest, LongContextDecodeMergesSplits) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t window : {int64_t(0), int64_t(700)}) {
      Problem pb;
      pb.layout = {dtype, 16, 4, 128};
      pb.group = 4;
      pb.window = window;
      pb.q_pos = Rand(1500, 4000);
      pb.first_block = Rand(0, 1) == 1 ? Rand(1, 50) : 0;
      SCOPED_TRACE(Describe(pb));
      CheckProblem(pb);
    }
  }
}

// Many query blocks, some evicted prefix, a window; prefill with and without splits.
TEST_F(PagedAttentionTest, LongPrefillMatchesReference) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (int group : {1, 8}) {
    Problem pb;
    pb.layout = {DType::kFloat16, 16, 2, 64};
    pb.group = group;
    pb.window = group == 1 ? 0 : 300;
    pb.q_pos = Rand(200, 600);
    pb.first_block = 3;
    pb.n = Rand(60, 150);
    SCOPED_TRACE(Describe(pb));
    CheckProblem(pb);
  }
}

// Head dims off the sweep: 36 (not a multiple of 8: the portable tile even when
// vectorised), 40 and 72 (multiples of 8, not 16: AVX2 where AVX-512 is in use; a tail
// of dims after the register-blocked ones), 48 (AVX-512, but not the 32-wide bf16 dot
// product: a 16-wide tail), 160 (bf16 dot product over five 32-dim steps).
TEST_F(PagedAttentionTest, UnusualHeadDimsMatchReference) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int head_dim : {36, 40, 48, 72, 160}) {
      for (int64_t n : {int64_t(1), int64_t(5)}) {
        Problem pb;
        pb.layout = {dtype, 8, 2, head_dim};
        pb.group = 2;
        pb.q_pos = Rand(10, 60);
        pb.n = n;
        pb.window = Rand(0, 1) == 1 ? 9 : 0;
        SCOPED_TRACE(Describe(pb));
        CheckProblem(pb);
      }
    }
  }
}

// Each family the CPU has (up to KVARENA_CPU_KERNELS) is chosen by default where it applies, and
// forcing a lower one (as the sweeps do) picks that one's tile; head dims a family does not handle
// fall back.
TEST_F(PagedAttentionTest, SelectsEachKernelFamilyTheCpuHas) {
  using cpu_internal::SelectAttendTile;
  const CpuKernels has = default_kernels_;  // what the CPU has, capped by KVARENA_CPU_KERNELS
  std::printf("CPU kernels supported: %s, in use: %s\n", CpuKernelsName(CpuKernelsSupported()),
              CpuKernelsName(has));
  EXPECT_LE(int(has), int(CpuKernelsSupported()));
  EXPECT_EQ(TileWith(CpuKernels::kPortable, 128, DType::kFloat16),
            &cpu_internal::PortableAttendTile);
  if (has >= CpuKernels::kAvx2) {
    EXPECT_EQ(TileWith(CpuKernels::kAvx2, 128, DType::kBFloat16), &cpu_internal::Avx2AttendTile);
    EXPECT_EQ(TileWith(CpuKernels::kAvx2, 36, DType::kFloat16), &cpu_internal::PortableAttendTile);
  }
  if (has >= CpuKernels::kAvx512) {
    EXPECT_EQ(TileWith(CpuKernels::kAvx512, 128, DType::kBFloat16),
              &cpu_internal::Avx512AttendTile);
    EXPECT_EQ(TileWith(CpuKernels::kAvx512, 128, DType::kFloat16), &cpu_internal::Avx512AttendTile);
    EXPECT_EQ(TileWith(CpuKernels::kAvx512, 72, DType::kFloat16), &cpu_internal::Avx2AttendTile);
    EXPECT_EQ(TileWith(CpuKernels::kAvx512, 128, DType::kFloat16, KvFormat::kInt8),
              &cpu_internal::Avx512AttendTile);
  }
  if (has >= CpuKernels::kAvx512Vnni) {
    EXPECT_EQ(TileWith(CpuKernels::kAvx512Vnni, 128, DType::kFloat16, KvFormat::kInt8),
              &cpu_internal::Avx512VnniAttendTile);
    EXPECT_EQ(TileWith(CpuKernels::kAvx512Vnni, 96, DType::kFloat16, KvFormat::kInt8),
              &cpu_internal::Avx512AttendTile);  // head_dim % 64 != 0
    EXPECT_EQ(TileWith(CpuKernels::kAvx512Vnni, 128, DType::kFloat16),
              &cpu_internal::Avx512AttendTile);  // 16-bit pages
  }
  if (has >= CpuKernels::kAvx512Bf16) {
    EXPECT_EQ(TileWith(CpuKernels::kAvx512Bf16, 128, DType::kBFloat16, KvFormat::kInt8),
              &cpu_internal::Avx512VnniAttendTile);
    EXPECT_EQ(TileWith(CpuKernels::kAvx512Bf16, 128, DType::kBFloat16),
              &cpu_internal::Avx512Bf16AttendTile);
    EXPECT_EQ(TileWith(CpuKernels::kAvx512Bf16, 128, DType::kFloat16),
              &cpu_internal::Avx512AttendTile);
    EXPECT_EQ(TileWith(CpuKernels::kAvx512Bf16, 48, DType::kBFloat16),
              &cpu_internal::Avx512AttendTile);
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      EXPECT_EQ(TileWith(CpuKernels::kAvx512Bf16, 128, dtype, KvFormat::kFp8E4M3),
                &cpu_internal::Avx512Bf16Fp8AttendTile);
      EXPECT_EQ(TileWith(CpuKernels::kAvx512Bf16, 48, dtype, KvFormat::kFp8E4M3),
                &cpu_internal::Avx512AttendTile);  // head_dim % 32 != 0
      EXPECT_EQ(TileWith(CpuKernels::kAvx512Vnni, 128, dtype, KvFormat::kFp8E4M3),
                &cpu_internal::Avx512AttendTile);
    }
  }
  // Forcing a family above what the CPU has gives what it has.
  TEST_ForceCpuKernels(CpuKernels::kAvx512Bf16);
  EXPECT_EQ(CpuKernelsInUse(), default_kernels_);
  EXPECT_EQ(CpuKernelsVectorized(), default_kernels_ != CpuKernels::kPortable);
  // The sweeps run one variant per family in use, each with and without the pool, but for
  // a family that picks a lower one's tile (avx512_vnni on bf16 pages).
  const size_t repeats = has >= CpuKernels::kAvx512Vnni ? 1 : 0;
  EXPECT_EQ(VariantsFor(128, DType::kBFloat16).size(),
            2 * (size_t(int(default_kernels_) + 1) - repeats));
}

// A batch of sequences with different lengths, evicted prefixes and positions, in one call:
// each sequence's output matches its float64 reference, none is written past the batch,
// with and without the pool, by every kernel family the machine has; half the problems on
// fp8 pages.
TEST_F(PagedAttentionTest, BatchMatchesReferencePerSequence) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int batch : {1, 3, 9}) {
      for (int64_t n : {int64_t(1), int64_t(3)}) {
        // fp8 pages on every other problem (the tile on AVX512_BF16 rounds q to bf16).
        const KvFormat format =
            (batch == 3) == (n == 1) ? KvFormat::kFp8E4M3 : KvFormat::kUnspecified;
        const PageLayout layout{dtype, 8, 2, 64, format};
        const int group = 4, num_q_heads = layout.num_kv_heads * group;
        const int64_t window = Rand(0, 1) == 1 ? Rand(5, 400) : 0;
        std::vector<std::unique_ptr<TestPagedLayer>> layers;
        std::vector<PagedKvView> views;
        std::vector<int64_t> q_pos;
        std::vector<uint8_t> q;
        std::vector<double> want, want_qb;
        AttentionParams params;
        params.num_q_heads = num_q_heads;
        params.n = n;
        params.scale = 1.0f / std::sqrt(64.0f);
        params.window = window;
        params.q_pos = -12345;  // ignored
        for (int b = 0; b < batch; ++b) {
          const int64_t pos = Rand(0, 1) == 1 ? Rand(0, 40) : Rand(600, 1500);
          const int64_t first_block = pos >= 8 && Rand(0, 2) == 0 ? Rand(1, pos / 8) : 0;
          layers.push_back(std::make_unique<TestPagedLayer>(layout, first_block, pos + n, rng_));
          layers.back()->FillRandom(rng_);
          views.push_back(layers.back()->view());
          q_pos.push_back(pos);
          const std::vector<uint8_t> qb =
              RandomStored(dtype, size_t(num_q_heads) * n * layout.head_dim, rng_);
          const std::vector<double> qv = DecodeAll(dtype, qb);
          const std::vector<double> w =
              ReferenceAttention(*layers.back(), qv, num_q_heads, pos, n, params.scale, window);
          const std::vector<double> wb = ReferenceAttention(
              *layers.back(), BFloat16Queries(qv), num_q_heads, pos, n, params.scale, window);
          q.insert(q.end(), qb.begin(), qb.end());
          want.insert(want.end(), w.begin(), w.end());
          want_qb.insert(want_qb.end(), wb.begin(), wb.end());
        }
        const double out_rel = dtype == DType::kFloat16    ? 0x1p-11
                               : dtype == DType::kBFloat16 ? 0x1p-8
                                                           : 0.0;
        for (const Variant& variant : VariantsFor(layout.head_dim, dtype, format)) {
          SCOPED_TRACE(::testing::Message()
                       << DTypeName(dtype) << " kv_format=" << KvFormatName(layout.format())
                       << " batch=" << batch << " n=" << n << " window=" << window << " "
                       << VariantName(variant));
          const std::vector<double>& want_v =
              TileWith(variant.kernels, layout.head_dim, dtype, format) ==
                      &cpu_internal::Avx512Bf16Fp8AttendTile
                  ? want_qb
                  : want;
          TEST_ForceCpuKernels(variant.kernels);
          std::vector<uint8_t> out(q.size() + 64, 0xFF);
          PagedAttentionBatch(views.data(), q_pos.data(), batch, params, q.data(), out.data(),
                              variant.pooled ? &pool_ : nullptr);
          TEST_ForceCpuKernels(CpuKernels::kAvx512Bf16);
          EXPECT_TRUE(std::all_of(out.begin() + q.size(), out.end(), [](uint8_t b) {
            return b == 0xFF;
          })) << "wrote past the output";
          out.resize(q.size());
          const std::vector<double> got = DecodeAll(dtype, out);
          const size_t per_seq = want_v.size() / size_t(batch);
          size_t bad = 0;
          for (size_t i = 0; i < want_v.size() && bad < 5; ++i) {
            const double tol = 1e-5 + out_rel * std::fabs(want_v[i]);
            if (!(std::fabs(got[i] - want_v[i]) <= tol)) {  // NaN fails too
              ++bad;
              ADD_FAILURE() << "sequence " << i / per_seq << " (q_pos " << q_pos[i / per_seq]
                            << ") element " << i % per_seq << ": got " << got[i] << " want "
                            << want_v[i];
            }
          }
        }
      }
    }
  }
}

// Callers on several threads share one pool; each gets the result a lone caller gets.
TEST_F(PagedAttentionTest, ConcurrentCallersShareOnePool) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed_);
  const PageLayout layout{DType::kFloat16, 16, 4, 128};
  TestPagedLayer layer(layout, 0, 3000, rng_);
  layer.FillRandom(rng_);
  AttentionParams params;
  params.num_q_heads = 16;
  params.q_pos = 2999;
  params.scale = 0.1f;
  constexpr int kCallers = 4;
  std::vector<std::vector<uint8_t>> q, lone(kCallers);
  for (int c = 0; c < kCallers; ++c) {
    q.push_back(RandomStored(layout.dtype, size_t(16) * 128, rng_));
    lone[c].assign(q[c].size(), 0xFF);
    PagedAttention(layer.view(), params, q[c].data(), lone[c].data(), &pool_);
  }
  std::vector<std::vector<uint8_t>> shared(kCallers, std::vector<uint8_t>(q[0].size()));
  std::vector<std::thread> threads;
  for (int c = 0; c < kCallers; ++c) {
    threads.emplace_back([&, c] {
      for (int rep = 0; rep < 20; ++rep) {
        std::fill(shared[c].begin(), shared[c].end(), 0xFF);
        PagedAttention(layer.view(), params, q[c].data(), shared[c].data(), &pool_);
        if (shared[c] != lone[c]) return;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(shared[c], lone[c]) << "caller " << c;
}

}  // namespace
}  // namespace kvarena
