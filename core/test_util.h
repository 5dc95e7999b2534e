// Test-only helpers for core/ tests: owned tensors with a TensorArg view, and the float64
// attention reference over a layer kept by position.
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
#include "tests/support/attention_reference.h"
#include "tests/support/dtype_codec.h"
#include "tests/support/status_matchers.h"

namespace kvarena {

using ::kvarena::testing::StatusIs;

// A [1, heads, n, dim] tensor holding float32 or bfloat16 values, with the float value of
// every stored element kept for references ([heads][n][dim]).
struct OwnedTensor {
  DType dtype = DType::kFloat32;
  int64_t heads = 0, n = 0, dim = 0;
  std::vector<uint8_t> bytes;
  std::vector<double> values;

  TensorArg Arg() const { return TensorArg{dtype, {1, heads, n, dim}, bytes.data(), bytes.size()}; }
  double at(int64_t h, int64_t t, int64_t d) const { return values[size_t((h * n + t) * dim + d)]; }
};

inline OwnedTensor RandomTensor(std::mt19937& rng, DType dtype, int64_t heads, int64_t n,
                                int64_t dim) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  OwnedTensor t{dtype, heads, n, dim, {}, {}};
  const size_t count = size_t(heads * n * dim);
  t.bytes.resize(count * DTypeSize(dtype));
  t.values.resize(count);
  for (size_t i = 0; i < count; ++i) {
    const float f = u(rng);
    if (dtype == DType::kBFloat16) {
      const uint16_t b = testing::FloatToBf16(f);
      std::memcpy(t.bytes.data() + 2 * i, &b, 2);
      t.values[i] = testing::Bf16ToFloat(b);
    } else {
      std::memcpy(t.bytes.data() + 4 * i, &f, 4);
      t.values[i] = f;
    }
  }
  return t;
}

// One layer's keys and values by absolute position: [pos][head][dim].
struct RefLayer {
  std::vector<std::vector<double>> k, v;
};

// out[h][i][d] for queries at positions q_pos + i over keys in
// [max(0, p - window + 1), p] (window 0: all): the float64 reference
// (tests/support/attention_reference.h) over the layer's rows.
inline std::vector<double> ReferenceAttention(const RefLayer& layer, const OwnedTensor& q,
                                              int64_t q_pos, int64_t kv_heads, double scale,
                                              int64_t window) {
  std::vector<double> k, v;
  for (size_t t = 0; t < layer.k.size(); ++t) {
    k.insert(k.end(), layer.k[t].begin(), layer.k[t].end());
    v.insert(v.end(), layer.v[t].begin(), layer.v[t].end());
  }
  const testing::ReferenceKv rows{k.data(),      v.data(),  0, int64_t(layer.k.size()),
                                  int(kv_heads), int(q.dim)};
  return testing::ReferenceAttention(rows, q.values.data(), int(q.heads), q.n, q_pos, scale,
                                     window);
}

}  // namespace kvarena

#endif  // KVARENA_CORE_TEST_UTIL_H_
