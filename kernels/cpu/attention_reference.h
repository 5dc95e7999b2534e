// Test-only: a float64 reference for PagedAttention, an independent decoder of stored
// f16 / bf16 / f32 values, and TestPagedLayer, one layer's K/V in a pool of shuffled,
// non-contiguous pages. Nothing here shares code with the kernels under test.
#ifndef KVARENA_KERNELS_CPU_ATTENTION_REFERENCE_H_
#define KVARENA_KERNELS_CPU_ATTENTION_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/paged_kv.h"

namespace kvarena::testing {

// Value of one stored element, decoded from its bits by definition (sign, exponent,
// mantissa), not by the kernels' converters.
inline double DecodeStored(DType dtype, const uint8_t* p) {
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  const int exp_bits = dtype == DType::kFloat16 ? 5 : 8;
  const int mant_bits = 15 - exp_bits;
  const int bias = (1 << (exp_bits - 1)) - 1;
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int e = (bits >> mant_bits) & ((1 << exp_bits) - 1);
  const int mant = bits & ((1 << mant_bits) - 1);
  if (e == (1 << exp_bits) - 1) return mant ? NAN : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(double(mant), 1 - bias - mant_bits);
  return sign * std::ldexp(double(mant + (1 << mant_bits)), e - bias - mant_bits);
}

inline std::vector<double> DecodeAll(DType dtype, const std::vector<uint8_t>& bytes) {
  const size_t elem = DTypeSize(dtype);
  std::vector<double> out(bytes.size() / elem);
  for (size_t i = 0; i < out.size(); ++i) out[i] = DecodeStored(dtype, bytes.data() + i * elem);
  return out;
}

// n elements of dtype holding finite values in roughly [-1, 1] (any bit pattern of a
// finite value in range is fine: the reference reads back whatever was stored).
inline std::vector<uint8_t> RandomStored(DType dtype, size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint8_t> out(n * DTypeSize(dtype));
  for (size_t i = 0; i < n; ++i) {
    const float f = dist(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (dtype == DType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &f, 4);
    } else if (dtype == DType::kBFloat16) {
      const uint16_t b = uint16_t(u >> 16);  // truncation: any bf16 in range will do
      std::memcpy(out.data() + 2 * i, &b, 2);
    } else {
      const _Float16 h = static_cast<_Float16>(f);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// One layer in a pool of shuffled pages; bytes not written by Fill stay 0xFF (NaN in
// every dtype), so a kernel that reads them produces NaN.
class TestPagedLayer {
 public:
  // Positions [first_block * page_size, len) are readable; the pool has spare pages.
  TestPagedLayer(const PageLayout& layout, int64_t first_block, int64_t len, std::mt19937_64& rng) {
    const int64_t blocks = (len + layout.page_size - 1) / layout.page_size - first_block;
    const int64_t pool_pages = blocks + 3 + int64_t(rng() % 8);
    pool_.assign(size_t(pool_pages) * layout.PageBytes(), 0xFF);
    std::vector<int32_t> ids(pool_pages);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    table_.assign(ids.begin(), ids.begin() + blocks);
    view_.layout = layout;
    view_.pool_base = pool_.data();
    view_.block_table = table_.data();
    view_.first_block = first_block;
    view_.num_blocks = blocks;
    view_.len = len;
  }

  const PagedKvView& view() const { return view_; }
  std::vector<uint8_t>& pool_bytes() { return pool_; }

  // Element (kv, position t, head h, dim d), located by the layout's formula.
  uint8_t* At(int kv, int64_t t, int h, int d) {
    const PageLayout& l = view_.layout;
    const int64_t block = t / l.page_size - view_.first_block;
    return pool_.data() + size_t(table_[block]) * l.PageBytes() +
           (size_t(kv) * l.page_size + size_t(t % l.page_size)) * l.TokenBytes() +
           (size_t(h) * l.head_dim + d) * l.ElemBytes();
  }

  // Writes random K and V for every readable position.
  void FillRandom(std::mt19937_64& rng) {
    const PageLayout& l = view_.layout;
    const size_t row = size_t(l.head_dim) * l.ElemBytes();
    for (int64_t t = view_.first_pos(); t < view_.len; ++t) {
      for (int kv = 0; kv < 2; ++kv) {
        const std::vector<uint8_t> vals =
            RandomStored(l.dtype, size_t(l.num_kv_heads) * l.head_dim, rng);
        for (int h = 0; h < l.num_kv_heads; ++h)
          std::memcpy(At(kv, t, h, 0), vals.data() + h * row, row);
      }
    }
  }

  double Value(int kv, int64_t t, int h, int d) {
    return DecodeStored(view_.layout.dtype, At(kv, t, h, d));
  }

 private:
  std::vector<uint8_t> pool_;
  std::vector<int32_t> table_;
  PagedKvView view_;
};

// out[h][i][:] for q [num_q_heads][n][head_dim] (decoded), in float64: softmax over keys
// t in [max(first_pos, p - window + 1), p], p = q_pos + i, of scale * q . K[t], times V.
inline std::vector<double> ReferenceAttention(TestPagedLayer& layer, const std::vector<double>& q,
                                              int num_q_heads, int64_t q_pos, int64_t n,
                                              double scale, int64_t window) {
  const PagedKvView& view = layer.view();
  const int dim = view.layout.head_dim;
  const int kv_heads = view.layout.num_kv_heads;
  const int group = num_q_heads / kv_heads;
  const int64_t first = view.first_pos();
  // Decoded K and V: [kv][t - first][head][dim].
  const size_t per_kv = size_t(view.len - first) * kv_heads * dim;
  std::vector<double> kv(2 * per_kv);
  for (int c = 0; c < 2; ++c) {
    for (int64_t t = first; t < view.len; ++t) {
      for (int h = 0; h < kv_heads; ++h) {
        for (int d = 0; d < dim; ++d) {
          kv[c * per_kv + ((t - first) * kv_heads + h) * dim + d] = layer.Value(c, t, h, d);
        }
      }
    }
  }
  auto row = [&](int c, int64_t t, int h) {
    return kv.data() + c * per_kv + ((t - first) * kv_heads + h) * dim;
  };
  std::vector<double> out(size_t(num_q_heads) * n * dim, 0.0);
  std::vector<double> w;
  for (int h = 0; h < num_q_heads; ++h) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = q_pos + i;
      const int64_t lo = std::max(first, window > 0 ? p - window + 1 : int64_t(0));
      const double* qv = q.data() + (size_t(h) * n + i) * dim;
      w.assign(size_t(p - lo + 1), 0.0);
      double m = -INFINITY;
      for (int64_t t = lo; t <= p; ++t) {
        const double* k = row(0, t, h / group);
        double s = 0;
        for (int d = 0; d < dim; ++d) s += qv[d] * k[d];
        w[t - lo] = s * scale;
        m = std::max(m, w[t - lo]);
      }
      double sum = 0;
      for (double& x : w) sum += (x = std::exp(x - m));
      double* o = out.data() + (size_t(h) * n + i) * dim;
      for (int64_t t = lo; t <= p; ++t) {
        const double* v = row(1, t, h / group);
        const double wt = w[t - lo] / sum;
        for (int d = 0; d < dim; ++d) o[d] += wt * v[d];
      }
    }
  }
  return out;
}

}  // namespace kvarena::testing

#endif  // KVARENA_KERNELS_CPU_ATTENTION_REFERENCE_H_
