// Test-only helpers for core/ tests: owned tensors with a TensorArg view, and a float64 reference attention.
#ifndef KVARENA_CORE_TEST_UTIL_H_
#define KVARENA_CORE_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/types.h"
#include "gmock/gmock.h"
#include "tests/support/status_matchers.h"

namespace kvarena {

using ::kvarena::testing::StatusIs;

inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return uint16_t(u >> 16);
}
inline float Bf16ToFloat(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A [1, heads, n, dim] tensor holding float32 or bfloat16 values, with the float value of
// every stored element kept for references ([heads][n][dim]).
struct OwnedTensor {
  DType dtype = DType::kFloat32;
  int64_t heads = 0, n = 0, dim = 0;
  std::vector<uint8_t> bytes;
  std::vector<double> values;

  TensorArg Arg() const {
    return TensorArg{dtype, {1, heads, n, dim}, bytes.data(), bytes.size()};
  }
  double at(int64_t h, int64_t t, int64_t d) const { return values[size_t((h * n + t) * dim + d)]; }
};

inline OwnedTensor RandomTensor(std::mt19937& rng, DType dtype, int64_t heads, int64_t n, int64_t dim) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  OwnedTensor t{dtype, heads, n, dim, {}, {}};
  const size_t count = size_t(heads * n * dim);
  t.bytes.resize(count * DTypeSize(dtype));
  t.values.resize(count);
  for (size_t i = 0; i < count; ++i) {
    const float f = u(rng);
    if (dtype == DType::kBFloat16) {
      const uint16_t b = FloatToBf16(f);
      std::memcpy(t.bytes.data() + 2 * i, &b, 2);
      t.values[i] = Bf16ToFloat(b);
    } else {
      std::memcpy(t.bytes.data() + 4 * i, &f, 4);
      t.values[i] = f;
    }
  }
  return t;
}

// Decodes float32 / bfloat16 bytes to doubles.
inline std::vector<double> Decode(DType dtype, const void* data, size_t count) {
  std::vector<double> out(count);
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < count; ++i) {
    if (dtype == DType::kBFloat16) {
      uint16_t b;
      std::memcpy(&b, p + 2 * i, 2);
      out[i] = Bf16ToFloat(b);
    } else {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      out[i] = f;
    }
  }
  return out;
}

// One layer's keys and values by absolute position: [pos][head][dim].
struct RefLayer {
  std::vector<std::vector<double>> k, v;
};

// out[h][i][d] for queries at positions q_pos + i over keys in
// [max(0, p - window + 1), p] (window 0: all), float64 throughout.
inline std::vector<double> ReferenceAttention(const RefLayer& layer, const OwnedTensor& q,
                                              int64_t q_pos, int64_t kv_heads, double scale,
                                              int64_t window) {
  const int64_t group = q.heads / kv_heads;
  std::vector<double> out(size_t(q.heads * q.n * q.dim), 0.0);
  for (int64_t h = 0; h < q.heads; ++h) {
    const int64_t kh = h / group;
    for (int64_t i = 0; i < q.n; ++i) {
      const int64_t p = q_pos + i;
      const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
      std::vector<double> s;
      double m = -INFINITY;
      for (int64_t t = lo; t <= p; ++t) {
        double dot = 0;
        for (int64_t d = 0; d < q.dim; ++d) dot += q.at(h, i, d) * layer.k[size_t(t)][size_t(kh * q.dim + d)];
        s.push_back(dot * scale);
        m = std::max(m, s.back());
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - m));
      for (int64_t t = lo; t <= p; ++t) {
        const double w = s[size_t(t - lo)] / sum;
        for (int64_t d = 0; d < q.dim; ++d) {
          out[size_t((h * q.n + i) * q.dim + d)] += w * layer.v[size_t(t)][size_t(kh * q.dim + d)];
        }
      }
    }
  }
  return out;
}

}  // namespace kvarena

#endif  // KVARENA_CORE_TEST_UTIL_H_
