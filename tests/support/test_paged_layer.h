// Test-only: TestPagedLayer, one layer's K/V in a pool of shuffled, non-contiguous pages
// (the layout of kernels/paged_kv.h), and the float64 attention reference over it
// (attention_reference.h, after gathering its rows). Nothing here shares code with the
// kernels under test. Not thread-safe per object.
#ifndef KVARENA_TESTS_SUPPORT_TEST_PAGED_LAYER_H_
#define KVARENA_TESTS_SUPPORT_TEST_PAGED_LAYER_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "kernels/paged_kv.h"
#include "tests/support/attention_reference.h"
#include "tests/support/dtype_codec.h"

namespace kvarena::testing {

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

  // Writes random K and V for every readable position: values of the activation dtype in
  // [-1, 1] for a plain format; for int8 random codes in [-127, 127] and a scale per
  // (token, head) in [2^-9, 2^-6] (values up to about 2), as kvarena/paged_kv.h lays them;
  // for fp8 random codes below 2 (subnormals and both signs included) and a static scale
  // per head for K and for V in [0.5, 1.5].
  void FillRandom(std::mt19937_64& rng) {
    const PageLayout& l = view_.layout;
    if (l.ScaleBytes() > 0) return FillRandomInt8(rng);
    if (l.format() == KvFormat::kFp8E4M3) return FillRandomFp8(rng);
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

  // The value attention reads at (kv, t, h, d): the stored element, or for int8 the code
  // times its token's and head's scale (float32 arithmetic, as the format defines it).
  double Value(int kv, int64_t t, int h, int d) {
    if (view_.layout.format() == KvFormat::kFp8E4M3) {
      return Fp8E4M3Value(*At(kv, t, h, d)) * double(view_.StaticScale(kv, h));
    }
    if (view_.layout.ScaleBytes() > 0) {
      return double(float(int8_t(*At(kv, t, h, d))) * Scale(kv, t, h));
    }
    return DecodeStored(view_.layout.dtype, At(kv, t, h, d));
  }
  // int8: the scale of (kv, t, h), after the token row's values.
  float Scale(int kv, int64_t t, int h) {
    float s;
    std::memcpy(&s, At(kv, t, 0, 0) + view_.layout.ValueBytes() + 4 * size_t(h), 4);
    return s;
  }

  // fp8: the static scales, [num_kv_heads] each, that view() hands the kernels.
  void SetStaticScales(std::vector<float> k, std::vector<float> v) {
    k_scales_ = std::move(k);
    v_scales_ = std::move(v);
    view_.k_scales = k_scales_.data();
    view_.v_scales = v_scales_.data();
  }

 private:
  void FillRandomFp8(std::mt19937_64& rng) {
    const PageLayout& l = view_.layout;
    std::uniform_int_distribution<int> magnitude(0, 0x3F);  // exponent field <= 7: below 2
    std::uniform_real_distribution<float> scale(0.5f, 1.5f);
    std::vector<float> k(size_t(l.num_kv_heads)), v(k.size());
    for (size_t h = 0; h < k.size(); ++h) {
      k[h] = scale(rng);
      v[h] = scale(rng);
    }
    SetStaticScales(std::move(k), std::move(v));
    for (int64_t t = view_.first_pos(); t < view_.len; ++t) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int h = 0; h < l.num_kv_heads; ++h) {
          for (int d = 0; d < l.head_dim; ++d) {
            *At(kv, t, h, d) = uint8_t(magnitude(rng) | (rng() & 1 ? 0x80 : 0));
          }
        }
      }
    }
  }

  void FillRandomInt8(std::mt19937_64& rng) {
    const PageLayout& l = view_.layout;
    std::uniform_int_distribution<int> code(-127, 127);
    std::uniform_real_distribution<float> scale(0x1p-9f, 0x1p-6f);
    for (int64_t t = view_.first_pos(); t < view_.len; ++t) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int h = 0; h < l.num_kv_heads; ++h) {
          for (int d = 0; d < l.head_dim; ++d) *At(kv, t, h, d) = uint8_t(int8_t(code(rng)));
          const float s = scale(rng);
          std::memcpy(At(kv, t, 0, 0) + l.ValueBytes() + 4 * size_t(h), &s, 4);
        }
      }
    }
  }

  std::vector<uint8_t> pool_;
  std::vector<int32_t> table_;
  std::vector<float> k_scales_, v_scales_;
  PagedKvView view_;
};

// out[h][i][:] for q [num_q_heads][n][head_dim] (decoded) at positions q_pos + i over the
// layer's readable positions: ReferenceAttention (attention_reference.h) of its rows.
inline std::vector<double> ReferenceAttention(TestPagedLayer& layer, const std::vector<double>& q,
                                              int num_q_heads, int64_t q_pos, int64_t n,
                                              double scale, int64_t window) {
  const PagedKvView& view = layer.view();
  const int dim = view.layout.head_dim;
  const int kv_heads = view.layout.num_kv_heads;
  const int64_t first = view.first_pos();
  // Decoded K and V, token-major: [kv][t - first][head][dim].
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
  const ReferenceKv rows{kv.data(), kv.data() + per_kv, first, view.len - first, kv_heads, dim};
  return ReferenceAttention(rows, q.data(), num_q_heads, n, q_pos, scale, window);
}

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_SUPPORT_TEST_PAGED_LAYER_H_
