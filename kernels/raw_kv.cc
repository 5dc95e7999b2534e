// ReadRawKv (raw_kv.h): pages are read in groups of kPagesPerRead and their token rows
// split, head by head, into codes [heads][n][head_dim] and per-token scales [heads][n].
#include "kernels/raw_kv.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace kvarena {
namespace {

constexpr int64_t kPagesPerRead = 16;

// Shape and size of one output tensor.
void Shape(TensorOut* o, DType dtype, std::vector<int64_t> shape, size_t bytes) {
  o->dtype = dtype;
  o->shape = std::move(shape);
  o->data.assign(bytes, '\0');
}

}  // namespace

std::optional<uint64_t> RawKvBytes(const PageLayout& layout, int64_t n) {
  uint64_t rows = 0, bytes = 0;
  if (n < 0 || __builtin_mul_overflow(uint64_t(n), uint64_t{2}, &rows) ||
      __builtin_mul_overflow(rows, uint64_t(layout.TokenBytes()), &bytes)) {
    return std::nullopt;
  }
  const uint64_t static_scales =
      ScalesOf(layout.format()) == KvScales::kPerHead ? 2 * uint64_t(layout.num_kv_heads) * 4 : 0;
  if (__builtin_add_overflow(bytes, static_scales + kRawScalesFraming, &bytes)) return std::nullopt;
  return bytes;
}

absl::Status ReadRawKv(KvKernels& kernels, const PagedKvView& view, int64_t pos, int64_t n,
                       GetKvResult* r) {
  const PageLayout& l = view.layout;
  const int heads = l.num_kv_heads;
  const KvScales scales = ScalesOf(l.format());
  const size_t code_row = l.ValueBytes() / size_t(heads);  // one head of one token
  const size_t scale_bytes = l.ScaleBytes() / size_t(std::max(heads, 1));
  r->kv_format = l.format();
  for (TensorOut* o : {&r->k, &r->v}) {
    Shape(o, DType::kUnspecified, {1, heads, n, l.head_dim}, size_t(heads) * size_t(n) * code_row);
  }
  TensorOut* scale_out[2] = {&r->k_scales, &r->v_scales};
  for (int kv = 0; kv < 2; ++kv) {
    TensorOut* o = scale_out[kv];
    if (scales == KvScales::kPerToken) {
      Shape(o, DType::kFloat32, {1, heads, n}, size_t(heads) * size_t(n) * scale_bytes);
    } else if (scales == KvScales::kPerHead) {
      Shape(o, DType::kFloat32, {heads}, size_t(heads) * sizeof(float));
      for (int h = 0; h < heads; ++h) {
        const float s = view.StaticScale(kv, h);
        std::memcpy(o->data.data() + size_t(h) * sizeof(float), &s, sizeof(float));
      }
    } else {
      *o = TensorOut{};
    }
  }
  if (n <= 0) return absl::OkStatus();

  const int64_t ps = l.page_size;
  const int64_t first_page = pos / ps, end_page = (pos + n - 1) / ps + 1;
  std::vector<uint8_t> pages(size_t(std::min(kPagesPerRead, end_page - first_page)) *
                             l.PageBytes());
  TensorOut* codes[2] = {&r->k, &r->v};
  for (int64_t p0 = first_page; p0 < end_page; p0 += kPagesPerRead) {
    const int64_t count = std::min(kPagesPerRead, end_page - p0);
    if (absl::Status s = kernels.ReadPages(
            l, view.pool_base, view.block_table + (p0 - view.first_block), count, pages.data());
        !s.ok()) {
      return s;
    }
    const int64_t t_end = std::min(pos + n, (p0 + count) * ps);
    for (int64_t t = std::max(pos, p0 * ps); t < t_end; ++t) {
      const size_t page = size_t(t / ps - p0) * l.PageBytes();
      for (int kv = 0; kv < 2; ++kv) {
        const uint8_t* row = pages.data() + page + size_t(kv * ps + t % ps) * l.TokenBytes();
        for (int h = 0; h < heads; ++h) {
          const size_t at = size_t(h) * size_t(n) + size_t(t - pos);  // [h][t - pos]
          std::memcpy(codes[kv]->data.data() + at * code_row, row + size_t(h) * code_row, code_row);
          if (scales == KvScales::kPerToken) {
            std::memcpy(scale_out[kv]->data.data() + at * scale_bytes,
                        row + l.ValueBytes() + size_t(h) * scale_bytes, scale_bytes);
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvarena
