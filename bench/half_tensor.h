// Random float16 bench data: ToHalf and a wire Tensor of [1, heads, tokens, head_dim]
// halves in [-1, 1], shared by the benches that build requests. Header-only.
#ifndef KVARENA_BENCH_HALF_TENSOR_H_
#define KVARENA_BENCH_HALF_TENSOR_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kvarena/v1/kvarena.pb.h"

namespace kvarena {

// float -> IEEE half by truncation; bench data lies in [-1, 1], tiny values flush to zero.
inline uint16_t ToHalf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = (u >> 16) & 0x8000;
  const int exp = int((u >> 23) & 0xff) - 127 + 15;
  if (exp <= 0) return sign;
  return sign | uint16_t(exp << 10) | uint16_t((u >> 13) & 0x3ff);
}

// [1, heads, tokens, head_dim] float16 values in [-1, 1].
inline v1::Tensor HalfTensor(int heads, int tokens, int head_dim, std::mt19937* rng) {
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<uint16_t> v(size_t(heads) * tokens * head_dim);
  for (uint16_t& x : v) x = ToHalf(dist(*rng));
  v1::Tensor t;
  for (int64_t d : {1, heads, tokens, head_dim}) t.add_shape(d);
  t.set_dtype(v1::FLOAT16);
  t.set_data(v.data(), v.size() * 2);
  return t;
}

}  // namespace kvarena

#endif  // KVARENA_BENCH_HALF_TENSOR_H_
