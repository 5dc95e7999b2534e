// Test-only: the quantized formats' side of test_problems.h, shared by the emulator test
// (emulator_quant_test.cc) and the GPU test (kv_kernels_cuda_quant_test.cc): activations
// with outliers and specials, caches filled by the CPU kernel's own quantizing append,
// the float64 attention reference over the dequantized pages, and tolerance checks.
#ifndef KVARENA_KERNELS_CUDA_QUANT_TEST_PROBLEMS_H_
#define KVARENA_KERNELS_CUDA_QUANT_TEST_PROBLEMS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/dtype_convert.h"
#include "kernels/cpu/kv_kernels.h"
#include "kernels/cuda/test_problems.h"
#include "kernels/kv_quant.h"
#include "kernels/paged_kv.h"
#include "tests/support/attention_reference.h"

namespace kvarena::gpu::testing {

// n activations of `dtype`, uniform in [-1, 1); each is an outlier (times `outlier`, so
// fp8 saturates) with probability `p_outlier`, and +-inf / NaN with `p_special` each.
inline std::vector<uint8_t> RandomActivations(DType dtype, size_t n, std::mt19937_64& rng,
                                              double p_outlier = 0, float outlier = 1000,
                                              double p_special = 0) {
  std::uniform_real_distribution<float> x(-1.0f, 1.0f);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<float> f(n);
  for (float& e : f) {
    e = x(rng);
    const double r = u(rng);
    if (r < p_outlier) {
      e *= outlier;
    } else if (r < p_outlier + p_special) {
      e = rng() & 1 ? -std::numeric_limits<float>::infinity()
                    : std::numeric_limits<float>::infinity();
    } else if (r < p_outlier + 2 * p_special) {
      e = std::numeric_limits<float>::quiet_NaN();
    }
  }
  std::vector<uint8_t> out(n * DTypeSize(dtype));
  cpu_internal::StoreFromFloat(dtype, f.data(), n, out.data());
  return out;
}

// fp8: a static scale per head for K and for V in [0.25, 2] (others: none).
inline void SetRandomStaticScales(const Problem& pb, HostBatch& hb, std::mt19937_64& rng) {
  if (pb.layout.format() != KvFormat::kFp8E4M3) return;
  std::uniform_real_distribution<float> s(0.25f, 2.0f);
  std::vector<float> k(size_t(pb.layout.num_kv_heads)), v(k.size());
  for (size_t h = 0; h < k.size(); ++h) k[h] = s(rng), v[h] = s(rng);
  hb.SetStaticScales(std::move(k), std::move(v));
}

// Fills every readable position [first_pos, len) of every sequence with random K/V
// (|x| < 4) quantized by the CPU kernel's AppendKv.
inline void FillByCpuAppend(const Problem& pb, HostBatch& hb, std::mt19937_64& rng) {
  for (int b = 0; b < hb.batch(); ++b) {
    const PagedKvView view = hb.View(b);
    const int64_t n = view.len - view.first_pos();
    if (n <= 0) continue;
    const size_t count = size_t(pb.layout.num_kv_heads) * n * pb.layout.head_dim;
    const std::vector<uint8_t> k = RandomActivations(pb.layout.dtype, count, rng, 0.05, 4);
    const std::vector<uint8_t> v = RandomActivations(pb.layout.dtype, count, rng, 0.05, 4);
    ::kvarena::AppendKv(view, view.first_pos(), n, k.data(), v.data());
  }
}

// The value attention reads at (kv, t, h, d) of a quantized view, in float64 from the
// float32 arithmetic the format defines (kernels/kv_quant.h).
inline double QuantValue(const PagedKvView& view, int kv, int64_t t, int h, int d) {
  const PageLayout& l = view.layout;
  const uint8_t* row = view.TokenPtr(kv, t);
  const uint8_t code = row[size_t(h) * l.head_dim + d];
  if (l.format() == KvFormat::kFp8E4M3) {
    return double(DecodeFp8E4M3(code)) * double(view.StaticScale(kv, h));
  }
  float s;
  std::memcpy(&s, row + l.ValueBytes() + 4 * size_t(h), 4);
  return double(float(int8_t(code)) * s);
}

// The float64 reference of every sequence: [batch][num_q_heads][n][head_dim].
inline std::vector<double> QuantReference(const Problem& pb, HostBatch& hb,
                                          const std::vector<uint8_t>& q) {
  const PageLayout& l = pb.layout;
  const size_t per_seq = size_t(pb.num_q_heads()) * pb.n * l.head_dim;
  const std::vector<double> qd = DecodeAll(l.dtype, q);
  std::vector<double> out;
  for (int b = 0; b < hb.batch(); ++b) {
    const PagedKvView view = hb.View(b);
    const int64_t first = view.first_pos();
    const size_t per_kv = size_t(view.len - first) * l.num_kv_heads * l.head_dim;
    std::vector<double> kv(2 * per_kv);
    for (int c = 0; c < 2; ++c) {
      for (int64_t t = first; t < view.len; ++t) {
        for (int h = 0; h < l.num_kv_heads; ++h) {
          for (int d = 0; d < l.head_dim; ++d) {
            kv[c * per_kv + (size_t(t - first) * l.num_kv_heads + h) * l.head_dim + d] =
                QuantValue(view, c, t, h, d);
          }
        }
      }
    }
    const ::kvarena::testing::ReferenceKv rows{kv.data(),        kv.data() + per_kv, first,
                                               view.len - first, l.num_kv_heads,     l.head_dim};
    const std::vector<double> o =
        ::kvarena::testing::ReferenceAttention(rows, qd.data() + b * per_seq, pb.num_q_heads(),
                                               pb.n, pb.seqs[b].pos, pb.scale(), pb.window);
    out.insert(out.end(), o.begin(), o.end());
  }
  return out;
}

// Decoded got within abs + rel * |want| (plus one output ULP of dtype) of want; returns a
// description of the first few misfits.
inline std::string CompareWithin(DType dtype, const std::vector<uint8_t>& got_bytes,
                                 const std::vector<double>& want, double abs, double rel) {
  const std::vector<double> got = DecodeAll(dtype, got_bytes);
  const double ulp = dtype == DType::kFloat16 ? 0x1p-10 : dtype == DType::kBFloat16 ? 0x1p-7 : 0;
  std::ostringstream s;
  int bad = 0;
  if (got.size() != want.size()) return "size mismatch";
  for (size_t i = 0; i < want.size() && bad < 5; ++i) {
    const double tol = abs + (rel + ulp) * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= tol)) {  // NaN fails too
      ++bad;
      s << "element " << i << ": got " << got[i] << " want " << want[i] << "\n";
    }
  }
  return s.str();
}

// Bytes equal, or both decode as NaN (NaN payloads of a gather may differ).
inline bool SameOrBothNan(DType dtype, const uint8_t* a, const uint8_t* b, size_t n) {
  const size_t elem = DTypeSize(dtype);
  for (size_t i = 0; i < n; i += elem) {
    if (std::memcmp(a + i, b + i, elem) == 0) continue;
    if (!(std::isnan(::kvarena::testing::DecodeStored(dtype, a + i)) &&
          std::isnan(::kvarena::testing::DecodeStored(dtype, b + i)))) {
      return false;
    }
  }
  return true;
}

// Quantized attention problems: a sample of the sweep's shapes in `format`, plus the
// geometries that matter to the 1-byte kernels: 1 and 3 kv heads (int8 rows 4-byte
// aligned only), GQA with a window over a split key range.
inline std::vector<Problem> QuantAttentionSweep(KvFormat format, DType dtype, std::mt19937_64& rng,
                                                bool long_context) {
  std::vector<Problem> out = AttentionSweep(dtype, rng, long_context);
  for (size_t i = 0; i < out.size(); ++i) {
    Problem& pb = out[i];
    pb.layout.kv_format = format;
    if (i % 3 == 0 && pb.group <= 8) pb.layout.num_kv_heads = 3;  // odd: misaligned int8 rows
  }
  return out;
}

}  // namespace kvarena::gpu::testing

#endif  // KVARENA_KERNELS_CUDA_QUANT_TEST_PROBLEMS_H_
